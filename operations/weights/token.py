"""The Hugging Face token on the host: the download user's HF_HOME/token, mode 0600, written by that user.

The download user runs nothing but the fetcher (the standard library, no model code); the service user,
which runs the model's code (the servers, the flag check, the bench client), cannot read it.
"""

import shlex

from pyinfra import host
from pyinfra.api import operation

from operations.basics import gathering
from operations.basics.file_states import UserFileStates, matches
from operations.basics.secrets import write_secret
from operations.weights.config import Weights
from operations.weights.hub import controller_token


@operation()
def hf_token(weights: Weights):
    """
    Write the controller's Hugging Face token to the download user's HF_HOME token file, mode 0600, and
    remove the token a deployment without a download user kept in the service user's HF_HOME.

    + weights: the host's weights (their owner, its HF_HOME, the controller variable holding the token,
      else the controller's huggingface_hub token file; the service user and its earlier token file)

    **Example:**

    .. code:: python

        token.hf_token(name="Hugging Face token", weights=deployment.weights)
    """
    token = controller_token(weights.hf_token_env) or ""
    token_file = f"{weights.hf_home}/token"
    states = gathering.read(UserFileStates, user=weights.owner, paths=(weights.hf_home, token_file))
    earlier = gathering.read(UserFileStates, user=weights.reader,
                             paths=(weights.earlier_token_file,)).get(weights.earlier_token_file)
    if earlier:
        # As the service user, in its own directory: root follows no link it planted there.
        yield f"runuser -u {shlex.quote(weights.reader)} -- rm -f -- {shlex.quote(weights.earlier_token_file)}"
    if matches(states.get(weights.hf_home), "directory", "700", weights.owner) and \
            matches(states.get(token_file), "file", "600", weights.owner, token.encode()):
        host.noop(f"{token_file} holds the token (0600, {weights.owner})")
        return
    yield write_secret(token, weights.hf_home, "token", "600", weights.owner, as_user=weights.owner)


@gathering.wants
def _read(deployment, snapshots) -> gathering.Wanted:
    d = deployment.weights
    return [(UserFileStates, dict(user=d.owner, paths=(d.hf_home, f"{d.hf_home}/token"))),
            (UserFileStates, dict(user=d.reader, paths=(d.earlier_token_file,)))]
