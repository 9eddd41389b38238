"""The gateway stages deploy.py calls."""

from operations.basics import host_programs, ownership
from operations.gateway import service, workers
from operations.gateway.config import Gateway
from operations.python import venv


def gateway_deployed(gateway: Gateway, inventory, gateway_host, uv_installed: bool) -> None:
    """
    The gateway host's smg: its user, key, virtualenv, scripts and unit, and the inventory's workers of
    its model registered (after every worker's readiness: ``workers.workers_done`` orders it).

    + gateway: the host's gateway
    + inventory, gateway_host: pyinfra's inventory and this host (the workers are read from them)
    + uv_installed: uv is already installed by this host's worker stages

    **Example:**

    .. code:: python

        gateway_deployed(gateway, inventory, host, uv_installed=deployment is not None)
    """
    # Whom the gateway routes to before this run (read now, before any operation runs): a worker kept
    # out stays out, also through a restart of smg, which forgets its workers.
    before = workers.listed(gateway)
    ownership.service_user(name="Gateway user", user=gateway.user, home=gateway.home)
    key = service.api_key(name="Gateway API key", gateway=gateway)
    admin_key = service.admin_key(name="Gateway admin key", gateway=gateway)
    uv = venv.Uv(gateway.install_dir)
    if not uv_installed:
        venv.uv(name="uv", uv=uv, index_url=gateway.pip_index_url)
    smg = venv.requirement(name="smg", path=gateway.venv, distribution="smg", requirement=gateway.requirement,
                           index_url=gateway.pip_index_url, uv=uv)
    scripts = ownership.host_programs_uploaded(name="Gateway scripts", install_dir=gateway.install_dir,
                                               programs=host_programs.of_subject("gateway"))
    unit = service.configure(name="Gateway service", gateway=gateway, inputs=gateway.requirement,
                             restart_when=[key, admin_key, smg, scripts])
    workers.register_workers(name="Gateway workers", gateway=gateway,
                             wanted=workers.workers(inventory, gateway_host, gateway.model),
                             listing_before=before, restarted=unit)
