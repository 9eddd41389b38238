"""The gateway stages deploy.py calls."""

from deployment.gateway.config import Gateway
from deployment.gateway.membership import Worker
from operations.basics import host_programs, ownership
from operations.gateway import registry, service
from operations.python import virtualenvs


def gateway_deployed(gateway: Gateway, wanted: list[Worker], uv_installed: bool,
                     addresses: dict[str, str]) -> None:
    """
    The gateway host's smg: its user, key, virtualenv, scripts and unit, and the inventory's workers of
    its model registered (after every worker's readiness: ``registry.workers_done`` orders it), and no
    worker of another model.

    + gateway: the host's gateway
    + wanted: the inventory's workers of its model (``membership.workers``)
    + uv_installed: uv is already installed by this host's worker stages
    + addresses: each worker host's address as the gateway reaches it (``membership.worker_addresses``)

    **Example:**

    .. code:: python

        gateway_deployed(gateway, membership.workers(fleet, host, gateway.model), uv_installed=bool(deployments),
                         addresses=membership.worker_addresses(fleet, host))
    """
    # Whom the gateway routes to before this run (read now, before any operation runs): a worker kept
    # out stays out, also through a restart of smg, which forgets its workers.
    before = registry.listed(gateway)
    ownership.service_user(name="Gateway user", user=gateway.user, home=gateway.home)
    ownership.root_directories(name="Root's directories", paths=(gateway.install_dir, f"{gateway.install_dir}/bin",
                                                                 gateway.config_dir))
    ownership.marked(name="The deploy's directories", paths=(gateway.install_dir, gateway.config_dir))
    key = service.api_key(name="Gateway API key", gateway=gateway)
    admin_key = service.admin_key(name="Gateway admin key", gateway=gateway)
    uv = virtualenvs.Uv(gateway.install_dir)
    if not uv_installed:
        virtualenvs.uv(name="uv", uv=uv, index_url=gateway.pip_index_url)
    virtualenvs.build_user([gateway.requirement])
    smg = virtualenvs.requirement(name="smg", path=gateway.venv, distribution="smg", requirement=gateway.requirement,
                           index_url=gateway.pip_index_url, uv=uv)
    scripts = ownership.host_programs_uploaded(name="Gateway scripts", install_dir=gateway.install_dir,
                                               programs=host_programs.of_subject("gateway"))
    unit = service.configure(name="Gateway service", gateway=gateway, inputs=gateway.requirement,
                             restart_when=[key, admin_key, smg, scripts])
    registry.register_workers(name="Gateway workers", gateway=gateway, wanted=wanted, listing_before=before,
                              restarted=unit, addresses=addresses)
