"""The server stages deploy.py calls."""

from pyinfra.api.operation import OperationMeta

from operations.basics import gathering, ownership
from operations.basics.file_states import FileStates
from operations.basics.ownership import SystemUser, upload_paths
from operations.nodes import rendezvous
from operations.nodes.group import NodeGroup
from operations.python import venv
from operations.python.venv import HostPython, Uv, VenvRequirement
from operations.server import api_key, readiness, unit
from operations.server.config import Server
from operations.server.unit import Restart


def root_directories(server: Server) -> tuple[str, ...]:
    """The directories root writes in or executes from: install, its bin/, configuration."""
    return (server.install_dir, f"{server.install_dir}/bin", server.config_dir)


def server_installed(server: Server) -> OperationMeta:
    """
    What the server runs as and from: its system user, root's directories, its API key, uv and SGLang's
    virtualenv, and the host programs. Returns the API key's operation (its change alone restarts).

    **Example:**

    .. code:: python

        key = server_installed(deployment.server)
    """
    s = server
    ownership.service_user(name="Service user", user=s.service_user, home=s.service_home)
    ownership.root_directories(name="Root's directories", paths=root_directories(s))
    key = api_key.api_key(name="API key", server=s)
    uv = Uv(s.install_dir)
    venv.uv(name="uv", uv=uv, index_url=s.pip_index_url)
    venv.requirement(name="SGLang", path=s.venv, distribution="sglang", requirement=s.sglang_requirement,
                     index_url=s.pip_index_url, uv=uv)
    ownership.host_programs_uploaded(name="Host scripts", install_dir=s.install_dir)
    return key


def server_serving(server: Server, restart: Restart, weight_bytes: int, group: NodeGroup | None) -> OperationMeta:
    """
    The unit (restarted only as ``restart`` decided), then the proof it serves within `ready_timeout_s`
    (by default from the size of the weights it loads): a generation through its HTTP server, or for a
    rank >= 1 of a node group, its link to rank 0. Returns the unit's operation.

    **Example:**

    .. code:: python

        server_serving(deployment.server, restart, weight_bytes=hub.total_bytes, group=deployment.node_group)
    """
    timeout_s = readiness.timeout_for(server, weight_bytes)
    configured = unit.configure(name="SGLang service", server=server, restart=restart)
    if group and not group.serves_http:
        rendezvous.joined(name="Rank joined rank 0", group=group, service=server.service_name, timeout_s=timeout_s)
    else:
        readiness.ready(name="SGLang generates", server=server, restarted=configured, timeout_s=timeout_s)
    return configured


@gathering.wants
def _read(deployment, snapshots) -> gathering.Wanted:
    s = deployment.server
    return [(SystemUser, dict(user=s.service_user)),
            (FileStates, dict(paths=root_directories(s))),
            (FileStates, dict(paths=(s.api_key_file,))),
            (FileStates, dict(paths=tuple(upload_paths(s.install_dir)))),
            (HostPython, dict(uv=Uv(s.install_dir).binary)),
            (VenvRequirement, dict(path=s.venv, distribution="sglang"))]
