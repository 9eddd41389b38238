"""The server's API key on the host: root's file the service reads, from the controller's variable."""

from pyinfra.api import operation

from operations.basics.secrets import controller_key_file
from operations.server.config import Server


@operation()
def api_key(server: Server):
    """
    Give the server the controller's API key (`api_key_env`) as a file root owns and the service reads.

    Without the variable the host keeps the key it has (a deploy from another shell does not
    open the server); the key file is removed only when `remove_api_key` asks for it.

    + server: the host's server (API key file, service user, api_key_env, remove_api_key)

    **Example:**

    .. code:: python

        api_key.api_key(name="API key", server=deployment.server)
    """
    d = server
    yield from controller_key_file(d.api_key_env, d.api_key_file, d.service_user, remove=d.remove_api_key)
