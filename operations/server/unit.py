"""The SGLang systemd unit: whether it restarts (one decision per run), written only when its inputs
change, validated first, and the previous one kept for the rollback (readiness.py proves it serves)."""

import shlex
from collections.abc import Callable
from dataclasses import dataclass, replace
from io import StringIO

from pyinfra import host
from pyinfra.api import operation
from pyinfra.api.operation import OperationMeta
from pyinfra.operations import files, systemd

from operations.basics import gathering
from operations.basics.failing import fail_host
from operations.basics.file_states import sha1_of
from operations.basics.host_programs import HOST_SCRIPTS
from operations.basics.templates import render
from operations.basics.units import ServiceState
from operations.python.venv import VenvRequirement, fingerprint
from operations.server.checks import refused_flags
from operations.server.config import Server
from operations.server.flags import rejection, server_args

PREVIOUS = ".specfleet-previous"  # suffix of the last unit/env that served

# Why the server (re)starts in a run.
FILES_CHANGED = "its unit or environment file changed"
INPUT_CHANGED = "an input operation changed (the API key)"
STOPPED = "it is not running"


def unit_files(server: Server, inputs: str) -> tuple[str, str]:
    """The rendered unit and environment file; `inputs` names what else forces a restart."""
    env_text = render("server/sglang.env.j2", s=server, env=server.env)
    unit_text = render("server/sglang.service.j2", s=server, args=[shlex.quote(a) for a in server_args(server)],
                       inputs=f"{inputs} env={sha1_of(env_text.encode())[:12]}")
    return unit_text, env_text


def inputs(server: Server, commits: dict[str, str]) -> str:
    """What the server is built from besides its unit (SGLang, the weights' commits by role, its launcher):
    a change restarts it."""
    launcher = sha1_of(HOST_SCRIPTS["launch_sglang"].read_bytes())[:12]
    return (f"sglang={fingerprint(server.sglang_requirement, server.pip_index_url)} "
            f"target={commits['target'][:12]} drafter={commits['drafter'][:12]} launcher={launcher}")


@dataclass(frozen=True)
class Decision:
    """What the SGLang unit's operation does in this run, and why."""

    reason: str | None  # FILES_CHANGED, INPUT_CHANGED, STOPPED; None: the server runs its current unit
    refused: str | None  # why the host's SGLang refuses the new files (nothing is written or restarted)
    unit_text: str
    env_text: str
    enabled: bool

    @property
    def restarts(self) -> bool:
        """The server stops and starts in this run (a drain must come first)."""
        return self.reason is not None and not self.refused


class Restart:
    """
    Whether and why the SGLang unit restarts in this run: the one decision the drain before it, the
    unit's operation and the rollback after it all take. Decided once per host, when an operation
    first asks at execution time (the stages before it have run by then): the unit and environment
    are rendered once and compared with the host's, and new files are validated once by the host's
    SGLang (as the service user, offline, with the unit's environment).

    + server: the host's server
    + inputs: what the server is built from (``inputs()``)
    + restart_when: operations (the API key) whose change alone needs a restart
    + decided_env: what the host's own measurements add to the unit's environment, asked when the decision
      is made (the GPU smoke test's P2P decision: ``operations.gpu.smoke.decided_env``)
    """

    def __init__(self, server: Server, inputs: str, restart_when: list[OperationMeta],
                 decided_env: Callable[[], dict[str, str]] | None = None):
        self.server, self.inputs, self.restart_when = server, inputs, restart_when
        self.decided_env = decided_env
        self._decision: Decision | None = None

    def decision(self) -> Decision:
        if self._decision is None:
            self._decision = self._decide()
        return self._decision

    def _decide(self) -> Decision:
        s = self.server
        if self.decided_env is not None:
            s = replace(s, env={**s.env, **self.decided_env()})
        unit_text, env_text = unit_files(s, self.inputs)
        current = gathering.read(ServiceState, unit_file=s.unit_file, env_file=s.env_file, service=s.service_name)
        enabled = current["enabled"] == "enabled"
        if (current["unit_sha1"], current["env_sha1"]) != (sha1_of(unit_text.encode()), sha1_of(env_text.encode())):
            # The installed SGLang validates the new files; before the run installs the wanted build
            # (--dry on a fresh host) there is none to ask yet.
            installed = gathering.read(VenvRequirement, path=s.venv, distribution="sglang")
            built = installed and installed["fingerprint"] == fingerprint(s.sglang_requirement, s.pip_index_url)
            return Decision(FILES_CHANGED, rejection(host, s, server_args(s)) if built else None, unit_text,
                            env_text, enabled)
        if any(op.changed for op in self.restart_when):
            return Decision(INPUT_CHANGED, None, unit_text, env_text, enabled)
        return Decision(STOPPED if current["active"] != "active" else None, None, unit_text, env_text, enabled)


@operation()
def configure(server: Server, restart: Restart):
    """
    Write the SGLang unit and its environment file and (re)start the service, only when they changed.

    The rendered arguments are validated by the SGLang installed on the host first: if it rejects
    them the deploy fails naming the flag, and the running service is untouched. The previous files
    are kept so a failed readiness check can restore them (``restore_command``). The restart is
    systemd's: SIGTERM, which SGLang answers by finishing its in-flight requests.

    + server: the host's server
    + restart: this run's restart decision (``Restart``), which a drain before may have asked too

    **Example:**

    .. code:: python

        restart = unit.Restart(server, unit.inputs(server, commits), restart_when=[key])
        unit.configure(name="SGLang service", server=server, restart=restart)
    """
    s, decision = server, restart.decision()
    if decision.refused:
        yield fail_host([refused_flags(s, decision.refused)])
        return
    if decision.reason == INPUT_CHANGED:
        yield from systemd.service._inner(service=s.service_name, running=True, restarted=True, enabled=True)
        return
    if decision.reason != FILES_CHANGED:
        if decision.reason == STOPPED or not decision.enabled:  # found stopped or disabled: converge it
            yield from systemd.service._inner(service=s.service_name, running=True, enabled=True)
        else:
            host.noop(f"{s.service_name} is running its current unit ({restart.inputs})")
        return
    for path in (s.unit_file, s.env_file):
        # Kept by hand (files has no "copy on the host"): root's own files in root's directories
        # (ownership.root_directories); a link at the backup's name is replaced, never written through.
        yield f"if [ -f {path} ]; then cp -p --remove-destination {path} {path}{PREVIOUS}; fi"
    yield from files.put._inner(src=StringIO(decision.env_text), dest=s.env_file, user="root", group="root",
                                mode="644")
    yield from files.put._inner(src=StringIO(decision.unit_text), dest=s.unit_file, user="root", group="root",
                                mode="644")
    yield from systemd.service._inner(service=s.service_name, running=True, restarted=True, enabled=True,
                                      daemon_reload=True)


def restore_command(server: Server) -> str:
    """The one command putting back the unit and environment that served before ``configure`` wrote new
    ones, and restarting it; it fails when there is none to put back."""
    s = server
    # mv: root renames its own backups in root's directories (ownership.root_directories).
    return " && ".join([
        f"test -f {s.unit_file}{PREVIOUS}",
        *(f"if [ -f {path}{PREVIOUS} ]; then mv -f {path}{PREVIOUS} {path}; fi" for path in (s.unit_file, s.env_file)),
        # One command, so the restore cannot stop half-way: daemon-reload and restart, as
        # pyinfra's systemd.service would yield them.
        "systemctl daemon-reload", f"systemctl restart {s.service_name}",
    ])


@gathering.wants
def _read(deployment, snapshots) -> gathering.Wanted:
    s = deployment.server
    return [(ServiceState, dict(unit_file=s.unit_file, env_file=s.env_file, service=s.service_name))]
