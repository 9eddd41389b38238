"""The SGLang systemd unit: written only when its inputs change, validated first (readiness.py proves it)."""

import shlex
from io import StringIO

from pyinfra import host
from pyinfra.api import operation
from pyinfra.api.operation import OperationMeta
from pyinfra.operations import files, systemd

from operations.basics import gathering
from operations.basics.units import ServiceState
from operations.deployment.config import Deployment
from operations.basics.failing import fail_host
from operations.basics.file_states import sha1_of
from operations.basics.file_states import FileStates
from operations.basics.host_programs import HOST_SCRIPTS
from operations.basics.ownership import SystemUser, upload_paths
from operations.server.flags import rejection, server_args
from operations.basics.templates import render
from operations.python.venv import HostPython, Uv, VenvRequirement, fingerprint

PREVIOUS = ".specfleet-previous"  # suffix of the last unit/env that served


def unit_files(deployment: Deployment, inputs: str) -> tuple[str, str]:
    """The rendered unit and environment file; `inputs` names what else forces a restart."""
    d = deployment
    env_text = render("server/sglang.env.j2", d=d, env=d.env)
    unit_text = render("server/sglang.service.j2", d=d, args=[shlex.quote(a) for a in server_args(d)],
                       inputs=f"{inputs} env={sha1_of(env_text.encode())[:12]}")
    return unit_text, env_text


# Why configure() (re)starts the server in a run (restart_reason); a drain before it keys on these.
FILES_CHANGED = "its unit or environment file changed"
INPUT_CHANGED = "an input operation changed (the API key)"
STOPPED = "it is not running"


def restart_reason(deployment: Deployment, inputs: str, restart_when: list[OperationMeta]) -> str | None:
    """Why `configure` (re)starts the server in this run, or None when it leaves the server running."""
    d = deployment
    unit_text, env_text = unit_files(d, inputs)
    current = gathering.read(ServiceState, unit_file=d.unit_file, env_file=d.env_file, service=d.service_name)
    if (current["unit_sha1"], current["env_sha1"]) != (sha1_of(unit_text.encode()), sha1_of(env_text.encode())):
        return FILES_CHANGED
    if any(op.changed for op in restart_when):
        return INPUT_CHANGED
    return STOPPED if current["active"] != "active" else None


@operation()
def configure(deployment: Deployment, inputs: str, restart_when: list[OperationMeta] | None = None):
    """
    Write the SGLang unit and its environment file and (re)start the service, only when they changed.

    The rendered arguments are validated by the SGLang installed on the host first:
    if it rejects them the deploy fails naming the flag, and the running service is
    untouched. The previous files are kept so a failed readiness check can restore them.
    The restart is systemd's: SIGTERM, which SGLang answers by finishing its in-flight requests.

    + deployment: the host's resolved deployment
    + inputs: what the server is built from (SGLang fingerprint, weights commits); written into the unit
    + restart_when: other operations (the API key) whose change alone needs a restart

    **Example:**

    .. code:: python

        service.configure(name="Configure the SGLang service", deployment=d, inputs="sglang=3f2a target=ab12")
    """
    d = deployment
    reason = restart_reason(d, inputs, restart_when or [])
    if reason == INPUT_CHANGED:
        yield from systemd.service._inner(service=d.service_name, running=True, restarted=True, enabled=True)
        return
    if reason != FILES_CHANGED:
        current = gathering.read(ServiceState, unit_file=d.unit_file, env_file=d.env_file, service=d.service_name)
        if reason == STOPPED or current["enabled"] != "enabled":  # found stopped or disabled: converge it
            yield from systemd.service._inner(service=d.service_name, running=True, enabled=True)
        else:
            host.noop(f"{d.service_name} is running its current unit ({inputs})")
        return

    rejected = refusal(d)
    if rejected:
        yield fail_host([f"{host.name}: the SGLang in {d.venv} rejects the rendered flags ({rejected}); "
                         f"fix the flag in group_data or the SGLang pin; {d.service_name} was left as it was"])
        return
    for path in (d.unit_file, d.env_file):
        # Kept by hand (files has no "copy on the host"): root's own files in root's directories
        # (layout.root_directories); a link at the backup's name is replaced, never written through.
        yield f"if [ -f {path} ]; then cp -p --remove-destination {path} {path}{PREVIOUS}; fi"
    unit_text, env_text = unit_files(d, inputs)
    yield from files.put._inner(src=StringIO(env_text), dest=d.env_file, user="root", group="root", mode="644")
    yield from files.put._inner(src=StringIO(unit_text), dest=d.unit_file, user="root", group="root", mode="644")
    yield from systemd.service._inner(service=d.service_name, running=True, restarted=True, enabled=True,
                                      daemon_reload=True)


def refusal(deployment: Deployment) -> str | None:
    """Why the host's SGLang refuses the rendered flags (configure then leaves the server as it is), or None."""
    return rejection(host, deployment, server_args(deployment))


def inputs(deployment: Deployment, snapshots) -> str:
    """What the server is built from besides its unit (SGLang, weights, its launcher): a change restarts it."""
    d = deployment
    launcher = sha1_of(HOST_SCRIPTS["launch_sglang"].read_bytes())[:12]
    return (f"sglang={fingerprint(d.sglang_requirement, d.pip_index_url)} "
            f"target={snapshots['target'].commit[:12]} drafter={snapshots['drafter'].commit[:12]} "
            f"launcher={launcher}")


@gathering.wants
def _read(deployment, snapshots) -> gathering.Wanted:
    d = deployment
    return [(ServiceState, dict(unit_file=d.unit_file, env_file=d.env_file, service=d.service_name)),
            (SystemUser, dict(user=d.service_user)),
            (FileStates, dict(paths=(d.install_dir, f"{d.install_dir}/bin", d.config_dir))),
            (FileStates, dict(paths=tuple(upload_paths(d.install_dir)))),
            (HostPython, dict(uv=Uv(d.install_dir).binary)),
            (VenvRequirement, dict(path=d.venv, distribution="sglang"))]
