"""The server stages deploy.py calls."""

from pyinfra import host
from pyinfra.api.operation import OperationMeta

from deployment.nodes.group import NodeGroup
from deployment.server.config import Engine, Server, ServiceHost
from operations.basics import gathering, ownership
from operations.basics.file_states import FileStates
from operations.basics.ownership import SystemUser, mark_of, upload_paths
from operations.nodes import rendezvous
from operations.python import virtualenvs
from operations.python.virtualenvs import HostPython, Uv, VenvRequirement, VenvsUsed
from operations.server import api_key, readiness, unit
from operations.server.unit import Replacement, Restart


def root_directories(service: ServiceHost) -> tuple[str, ...]:
    """The directories root writes in or executes from: install, its bin/, configuration."""
    return (service.install_dir, f"{service.install_dir}/bin", service.config_dir)


def marked_directories(service: ServiceHost) -> tuple[str, ...]:
    """The directories uninstall.py removes whole, which carry the deploy's mark (``ownership.marked``)."""
    return (service.install_dir, service.config_dir)


def builds(engines: tuple[Engine, ...]) -> list[Engine]:
    """One deployment per SGLang virtualenv among `engines` (deployments of one build share theirs)."""
    found: dict[str, Engine] = {}
    for e in engines:
        found.setdefault(e.venv, e)
    return list(found.values())


def deployment_users(engines: tuple[Engine, ...]) -> list[Engine]:
    """The deployments among `engines` that run as a user of their own (Engine.own_user)."""
    return [e for e in engines if e.own_user]


def server_installed(service: ServiceHost, engines: tuple[Engine, ...]) -> dict[str, list[OperationMeta]]:
    """
    What the servers run as and from: their system user, each deployment's own on a host of several (in
    the service user's group, which reads the weights and the keys), the downloads' (which owns the HF
    token and the weights), the build user where a build is a git requirement, root's directories, their API key and
    each deployment's worker admin key, uv and each SGLang build's virtualenv, and the host programs. Returns each
    deployment's keys' operations, by its name (a change of either alone restarts its replicas).

    + service: what the host's servers share (users, directories, keys)
    + engines: what each of the host's deployments runs (their replicas share its SGLang build)

    **Example:**

    .. code:: python

        keys = server_installed(worker.service, tuple(d.engine for d in deployments))
    """
    s = service
    ownership.service_user(name="Service user", user=s.service_user, home=s.service_home)
    for e in host.loop(deployment_users(engines)):
        ownership.service_user(name=f"User of {e.name}", user=e.user, home=e.home, group=s.service_user)
    ownership.service_user(name="Download user", user=s.download_user, home=s.download_home)
    ownership.root_directories(name="Root's directories", paths=root_directories(s))
    ownership.marked(name="The deploy's directories", paths=marked_directories(s))
    api = api_key.api_key(name="API key", service=s)
    keys = {e.name: [api, api_key.admin_key(name=f"Worker admin key of {e.name}", engine=e)]
            for e in host.loop(engines)}
    builds_installed(s, engines)
    ownership.host_programs_uploaded(name="Host scripts", install_dir=s.install_dir)
    return keys


def builds_installed(service: ServiceHost, engines: tuple[Engine, ...]) -> None:
    """
    uv and each SGLang build's virtualenv among `engines` (the deploy's, and the tuner's for the profiles it
    compares: another build of the model is installed beside the deployed one, which the next deploy prunes
    where no deployment wants it).

    + service: what the host's servers share (the install directory, the package index)
    + engines: the SGLang builds wanted, one engine each or more

    **Example:**

    .. code:: python

        builds_installed(worker.service, tuple(d.engine for d in deployments))
    """
    uv = Uv(service.install_dir)
    virtualenvs.uv(name="uv", uv=uv, index_url=service.pip_index_url)
    virtualenvs.build_user([build.sglang_requirement for build in builds(engines)])
    for build in host.loop(builds(engines)):
        virtualenvs.requirement(name=f"SGLang ({build.venv_name})", path=build.venv, distribution="sglang",
                                requirement=build.sglang_requirement, index_url=service.pip_index_url, uv=uv)


def server_serving(server: Server, restart: Restart, weight_bytes: int, group: NodeGroup | None,
                   replacement: Replacement) -> OperationMeta:
    """
    One replica's unit (restarted only as ``restart`` decided), then the proof it serves within
    `ready_timeout_s` (by default from the size of the weights it loads): a generation through its HTTP
    server, or for a rank >= 1 of a node group, its link to rank 0. A replica that fails it undoes the
    host's change (``replacement``). Returns the unit's operation.

    **Example:**

    .. code:: python

        server_serving(replica, restart, weight_bytes=hub.total_bytes, group=deployment.node_group,
                       replacement=replacement)
    """
    timeout_s = readiness.timeout_for(server.engine.service, weight_bytes)
    configured = unit.configure(name=f"SGLang service {server.service_name}", server=server, restart=restart)
    if group and not group.serves_http:
        rendezvous.joined(name="Rank joined rank 0", group=group, service=server.service_name, timeout_s=timeout_s)
    else:
        readiness.ready(name=f"SGLang generates {server.service_name}", server=server, restarted=configured,
                        timeout_s=timeout_s, replacement=replacement)
    return configured


VENV_STEM = "sglang-venv"  # every SGLang build's virtualenv is INSTALL_DIR/VENV_STEM* (config.venv_name)


def unit_patterns(service: ServiceHost) -> tuple[str, ...]:
    """The SGLang unit files of the host, the previous ones kept for a rollback among them."""
    return (f"/etc/systemd/system/{service.service_prefix}*.service*",)


def builds_pruned(service: ServiceHost, engines: tuple[Engine, ...]) -> OperationMeta:
    """
    Once every replica runs its wanted unit: remove the SGLang virtualenvs no deployment of the host wants
    and no unit file uses. A unit's previous file (its rollback) keeps its build, so that going back to the
    build before is a restart, not a rebuild.

    **Example:**

    .. code:: python

        builds_pruned(worker.service, tuple(d.engine for d in deployments))
    """
    return virtualenvs.unused_removed(name="SGLang builds no unit uses", directory=service.install_dir, stem=VENV_STEM,
                               units=unit_patterns(service), wanted=[e.venv for e in engines])


@gathering.wants
def _read(deployment) -> gathering.Wanted:
    e = deployment.engine
    s = e.service
    return [(SystemUser, dict(user=s.service_user)), (SystemUser, dict(user=s.download_user)),
            *([(SystemUser, dict(user=e.user))] if e.own_user else []),
            *([(SystemUser, dict(user=virtualenvs.BUILD_USER))] if virtualenvs.git_source(e.sglang_requirement) else []),
            (FileStates, dict(paths=root_directories(s))),
            (FileStates, dict(paths=tuple(map(mark_of, marked_directories(s))))),
            (FileStates, dict(paths=(s.api_key_file,))),
            (FileStates, dict(paths=(e.admin_key_file,))),
            (FileStates, dict(paths=tuple(upload_paths(s.install_dir)))),
            (HostPython, dict(uv=Uv(s.install_dir).binary)),
            (VenvRequirement, dict(path=e.venv, distribution="sglang")),  # each deployment's build
            (VenvsUsed, dict(directory=s.install_dir, stem=VENV_STEM, units=unit_patterns(s)))]
