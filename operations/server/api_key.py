"""The server's keys on the host, root's files the service reads: the API key, from the controller's
variable, and the worker admin key, generated on the host."""

from pyinfra.api import operation

from operations.basics.secrets import controller_key_file, host_key_file
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
    yield from controller_key_file(server.api_key_env, server.api_key_file, server.service_user,
                                   remove=server.remove_api_key)


@operation()
def admin_key(server: Server):
    """
    Give the host's servers a worker admin key of their own (SGLang's --admin-api-key): generated on the
    host, root's, readable by the service group, kept across runs. SGLang's admin-optional routes
    (/update_weights_from_disk, /set_internal_state, /load_lora_adapter, /flush_cache) then take it alone,
    so the clients' API key, which every gateway client holds, cannot reach them. Nothing leaves the host:
    whatever the product itself calls there (the benchmark's /flush_cache) reads the file on the host.

    + server: the host's server (its configuration directory and service user)

    **Example:**

    .. code:: python

        api_key.admin_key(name="Worker admin key", server=deployment.server)
    """
    yield from host_key_file(server.admin_key_file, server.service_user)
