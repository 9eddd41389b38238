"""The Hugging Face token on the host: the download user's HF_HOME/token, mode 0600, written by that user.

The download user runs nothing but the fetcher (the standard library, no model code); the service user,
which runs the model's code (the servers, the flag check, the bench client), cannot read it.
"""

import shlex

from pyinfra import host
from pyinfra.api import operation

from deployment.server.config import ServiceHost
from operations.basics import gathering
from operations.basics.file_states import UserFileStates, matches
from operations.basics.secret_files import write_secret
from operations.weights.hub import controller_token


@operation()
def hf_token(token_env: str, service: ServiceHost):
    """
    Write the controller's Hugging Face token to the download user's HF_HOME token file, mode 0600, and
    remove the token a deployment without a download user kept in the service user's HF_HOME.

    + token_env: the controller's variable holding the token (else its huggingface_hub token file)
    + service: the host's users (the download user, its HF_HOME; the service user, its earlier token file)

    **Example:**

    .. code:: python

        hf_token.hf_token(name="Hugging Face token", token_env=worker.hf_token_env, service=worker.service)
    """
    s = service
    token = controller_token(token_env) or ""
    token_file = f"{s.hf_home}/token"
    states = gathering.read(UserFileStates, user=s.download_user, paths=(s.hf_home, token_file))
    earlier = gathering.read(UserFileStates, user=s.service_user,
                             paths=(s.earlier_token_file,)).get(s.earlier_token_file)
    if earlier:
        # As the service user, in its own directory: root follows no link it planted there.
        yield f"runuser -u {shlex.quote(s.service_user)} -- rm -f -- {shlex.quote(s.earlier_token_file)}"
    if matches(states.get(s.hf_home), "directory", "700", s.download_user) and \
            matches(states.get(token_file), "file", "600", s.download_user, token.encode()):
        host.noop(f"{token_file} holds the token (0600, {s.download_user})")
        return
    yield write_secret(token, s.hf_home, "token", "600", s.download_user, as_user=s.download_user)


@gathering.wants
def _read(deployment) -> gathering.Wanted:
    s = deployment.host.service
    return [(UserFileStates, dict(user=s.download_user, paths=(s.hf_home, f"{s.hf_home}/token"))),
            (UserFileStates, dict(user=s.service_user, paths=(s.earlier_token_file,)))]
