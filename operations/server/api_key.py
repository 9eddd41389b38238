"""The server's keys on the host, root's files the servers read: the API key, from the controller's
variable, and each deployment's worker admin key, generated on the host."""

from pyinfra.api import operation

from deployment.server.config import Engine, ServiceHost
from operations.basics.secret_files import controller_key_file, host_key_file


@operation()
def api_key(service: ServiceHost):
    """
    Give the host's servers the controller's API key (`api_key_env`) as a file root owns and the service reads.

    Without the variable the host keeps the key it has (a deploy from another shell does not
    open the server); the key file is removed only when `remove_api_key` asks for it.

    + service: what the host's servers share (API key file, service user, api_key_env, remove_api_key)

    **Example:**

    .. code:: python

        api_key.api_key(name="API key", service=worker.service)
    """
    yield from controller_key_file(service.api_key_env, service.api_key_file, service.service_user,
                                   remove=service.remove_api_key)


@operation()
def admin_key(engine: Engine):
    """
    Give a deployment's servers a worker admin key of their own (SGLang's --admin-api-key): generated on the
    host, root's, readable by the group of the deployment's user alone (the group useradd makes with it, of
    which that user is the only member), kept across runs. SGLang's admin-optional routes
    (/update_weights_from_disk, /set_internal_state, /load_lora_adapter, /flush_cache) then take it alone,
    so the clients' API key, which every gateway client holds, cannot reach them, and on a host of several
    deployments neither can another deployment's model code. Nothing leaves the host: whatever the product
    itself calls there (the benchmark's /flush_cache) reads the file on the host, as root.

    + engine: the deployment (its key file, ``Engine.admin_key_file``, and its user)

    **Example:**

    .. code:: python

        api_key.admin_key(name="Worker admin key of qwen", engine=deployment.engine)
    """
    yield from host_key_file(engine.admin_key_file, engine.user)
