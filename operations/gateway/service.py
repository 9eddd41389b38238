"""The gateway's own service: its API key (root's file, from the controller's variable) and smg's unit,
restarted only when the unit or an input changed."""

import os
import posixpath
import shlex
from io import StringIO

from pyinfra import host
from pyinfra.api import operation
from pyinfra.api.operation import OperationMeta
from pyinfra.operations import systemd

from deployment import network
from deployment.gateway.config import Gateway
from operations.basics import gathering, shell
from operations.basics.failing import fail_host
from operations.basics.file_states import FileStates, digest_of, sha1_of
from operations.basics.secret_files import controller_key_file
from operations.basics.templates import render
from operations.basics.units import ServiceState, any_change


@operation()
def api_key(gateway: Gateway):
    """
    The controller's API key (`api_key_env`) as the gateway's root-owned 0640 key file (group: the
    gateway user). A key already there stays when the controller has none; it is removed only with
    `remove_api_key=true`, which is refused for a gateway listening beyond loopback. The key is read
    here, never an argument.

    + gateway: the host's resolved gateway

    **Example:**

    .. code:: python

        service.api_key(name="Gateway API key", gateway=g)
    """
    key = os.environ.get(gateway.api_key_env, "")
    state = gathering.read(FileStates, paths=(gateway.key_file,)).get(gateway.key_file)
    if gateway.exposed and not key and (not state or gateway.remove_api_key):
        yield fail_host([f"{host.name}: the gateway would listen on {gateway.bind_address} without a key: "
                         f"set ${gateway.api_key_env} on the controller or keep gateway_bind_address={network.LOOPBACK}"],
                        static=True)  # its data, the controller's variable and a file only this writes
        return
    if key and not state:
        yield f"install -d -m 755 -o root -g root {shlex.quote(posixpath.dirname(gateway.key_file))}"
    # On stdin, never through files.put, whose contents --diff prints; root's file the launcher can read.
    yield from controller_key_file(gateway.api_key_env, gateway.key_file, gateway.user, remove=gateway.remove_api_key)


@operation()
def admin_key(gateway: Gateway):
    """
    The controller's control-plane key (`gateway_admin_key_env`) as the gateway's root-owned 0640
    admin key file (group: the gateway user): registering and removing workers takes it, the clients'
    key no longer does. Required once the gateway has a clients' key, and refused equal to it (a
    client could then register workers). Kept when the controller has none; removed only with
    `remove_api_key=true`. The keys are read here, never arguments.

    + gateway: the host's resolved gateway

    **Example:**

    .. code:: python

        service.admin_key(name="Gateway admin key", gateway=g)
    """
    admin, client = os.environ.get(gateway.admin_key_env, ""), os.environ.get(gateway.api_key_env, "")
    states = gathering.read(FileStates, paths=(gateway.admin_key_file, gateway.key_file))
    admin_kept, client_kept = states.get(gateway.admin_key_file), states.get(gateway.key_file)
    with_client = bool(client or client_kept) and not gateway.remove_api_key
    if with_client and not (admin or admin_kept):
        yield fail_host([f"{host.name}: the gateway would let its clients register workers: set "
                         f"${gateway.admin_key_env} on the controller (16 to 512 characters, "
                         f"not ${gateway.api_key_env})"])
        return
    # Each key as it will be on the host: the controller's, else the kept file's digest (read on the host).
    admin_digest = digest_of(admin.encode()) if admin else (admin_kept or {}).get("digest")
    client_digest = digest_of(client.encode()) if client else (client_kept or {}).get("digest")
    if with_client and admin_digest == client_digest:
        yield fail_host([f"{host.name}: ${gateway.admin_key_env} is the clients' key (${gateway.api_key_env}): "
                         "the control plane needs a key of its own"])
        return
    if admin and not admin_kept:
        yield f"install -d -m 755 -o root -g root {shlex.quote(posixpath.dirname(gateway.admin_key_file))}"
    # On stdin, never through files.put, whose contents --diff prints; root's file the launcher can read.
    yield from controller_key_file(gateway.admin_key_env, gateway.admin_key_file, gateway.user,
                                   remove=gateway.remove_api_key)


def unit_text(gateway: Gateway, inputs: str) -> str:
    return render("gateway/smg.service.j2", g=gateway, args=[shlex.quote(a) for a in gateway.args()], inputs=inputs)


@operation()
def configure(gateway: Gateway, inputs: str, restart_when: list[OperationMeta]):
    """
    Write the smg unit and (re)start it, only when the unit or a restart input changed.

    + gateway: the host's resolved gateway
    + inputs: what the gateway runs (the smg requirement, its launcher); written into the unit
    + restart_when: operations whose change alone needs a restart (the key, the venv)

    **Example:**

    .. code:: python

        service.configure(name="Gateway service", gateway=g, inputs="smg==1.13.0", restart_when=[key])
    """
    text = unit_text(gateway, inputs)
    current = host.get_fact(ServiceState, unit_file=gateway.unit_file, env_file="/dev/null",
                            service=gateway.service_name)
    if current["unit_sha1"] == sha1_of(text.encode()):
        if any_change(restart_when):
            yield from systemd.service._inner(service=gateway.service_name, running=True, restarted=True, enabled=True)
        elif current["active"] != "active" or current["enabled"] != "enabled":
            yield from systemd.service._inner(service=gateway.service_name, running=True, enabled=True)
        else:
            host.noop(f"{gateway.service_name} is running its current unit ({inputs})")
        return
    yield from shell.put(src=StringIO(text), dest=gateway.unit_file, user="root", group="root", mode="644")
    yield from systemd.service._inner(service=gateway.service_name, running=True, restarted=True, enabled=True,
                                      daemon_reload=True)
