"""The Hugging Face token and the server's API key: 0600 files on the host, nowhere else.

Neither secret is ever an operation or fact argument (pyinfra prints those at
-v, pyinfra#1148): each operation reads its secret from the controller's
environment inside its body and uploads it as file content.
"""

import os
from io import StringIO

from pyinfra import host
from pyinfra.api import operation
from pyinfra.operations import files

from operations.deployment import Deployment
from operations.filestate import FileStates, matches, sha1_of
from operations.hub import controller_token


@operation()
def hf_token(deployment: Deployment):
    """
    Write the controller's Hugging Face token to the service user's HF_HOME token file, mode 0600.

    + deployment: the host's resolved deployment (service user, HF_HOME, the controller variable
      holding the token, else its huggingface_hub token file)

    **Example:**

    .. code:: python

        secrets.hf_token(name="Install the Hugging Face token", deployment=deployment)
    """
    d = deployment
    token = controller_token(d.hf_token_env) or ""
    token_file = f"{d.hf_home}/token"
    states = host.get_fact(FileStates, paths=(d.hf_home, token_file))
    if matches(states[d.hf_home], "directory", "700", d.service_user) and \
            matches(states[token_file], "file", "600", d.service_user, sha1_of(token.encode())):
        host.noop(f"{token_file} holds the token (0600, {d.service_user})")
        return
    yield from files.directory._inner(path=d.hf_home, user=d.service_user, group=d.service_user,
                                      mode="700")
    yield from files.put._inner(src=StringIO(token), dest=token_file, user=d.service_user,
                                group=d.service_user, mode="600")


@operation()
def api_key(deployment: Deployment):
    """
    Give the server the controller's API key (`api_key_env`) as a 0600 file, or remove it when unset.

    + deployment: the host's resolved deployment (config dir, service user, api_key_env)

    **Example:**

    .. code:: python

        secrets.api_key(name="Install the API key", deployment=deployment)
    """
    d = deployment
    key = os.environ.get(d.api_key_env)
    if not key:
        yield from files.file._inner(path=d.api_key_file, present=False)
        return
    yield from files.put._inner(src=StringIO(key), dest=d.api_key_file, user=d.service_user,
                                group=d.service_user, mode="600")
