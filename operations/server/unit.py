"""The SGLang systemd units, one per replica: whether each restarts (one decision per replica and run),
written only when its inputs change, validated first, and the previous one kept for the rollback
(readiness.py proves it serves); units no deployment wants any more are replaced: stopped before the new
ones start, restorable until they generate, removed after."""

import json
import shlex
from collections.abc import Callable
from dataclasses import dataclass, replace
from io import StringIO

from pyinfra import host
from pyinfra.api import FactBase, operation
from pyinfra.api.operation import OperationMeta
from pyinfra.operations import systemd

from deployment.server.command_line import server_args
from deployment.server.config import Engine, Server, ServiceHost
from operations.basics import gathering, shell
from operations.basics.failing import fail_host
from operations.basics.file_states import sha1_of
from operations.basics.host_programs import HOST_SCRIPTS, inline
from operations.basics.units import ServiceState, any_change
from operations.python.virtualenvs import VenvRequirement, fingerprint
from operations.server.checks import refused_flags
from operations.server.sandbox import gpu_minor_numbers, rejection, unit_files

PREVIOUS = ".specfleet-previous"  # suffix of the last unit/env that served

# Why the server (re)starts in a run.
FILES_CHANGED = "its unit or environment file changed"
INPUT_CHANGED = "an input operation changed (the API key)"
STOPPED = "it is not running"


def inputs(engine: Engine, commits: dict[str, str]) -> str:
    """What a deployment's servers are built from besides their units (SGLang, the weights' commits by role,
    the drafter's only where its profile has one, the launcher): a change restarts each."""
    launcher = sha1_of(HOST_SCRIPTS["launch_sglang"].read_bytes())[:12]
    drafter = f"drafter={commits['drafter'][:12]} " if engine.draft_model_dir is not None else ""
    return (f"sglang={fingerprint(engine.sglang_requirement, engine.service.pip_index_url)} "
            f"target={commits['target'][:12]} {drafter}launcher={launcher}")


@dataclass(frozen=True)
class Decision:
    """What the SGLang unit's operation does in this run, and why."""

    reason: str | None  # FILES_CHANGED, INPUT_CHANGED, STOPPED; None: the server runs its current unit
    refused: str | None  # why the host's SGLang refuses the new files (nothing is written or restarted)
    unit_text: str
    env_text: str
    enabled: bool
    new: bool = False  # the host had no unit of this name before the run: it has no previous one to restore

    @property
    def restarts(self) -> bool:
        """The server stops and starts in this run (a drain must come first)."""
        return self.reason is not None and not self.refused


class Restart:
    """
    Whether and why one replica's SGLang unit restarts in this run: the one decision the drain before it,
    the unit's operation and the rollback after it all take. Decided once per replica, when an operation
    first asks at execution time (the stages before it have run by then): the unit and environment
    are rendered once and compared with the host's, and new files are validated once by the host's
    SGLang (as the service user, offline, with the unit's environment).

    + server: the replica's server
    + inputs: what the server is built from (``inputs()``)
    + restart_when: operations (the API key) whose change alone needs a restart
    + decided_env: what the host's own measurements add to the unit's environment, asked when the decision
      is made (the GPU smoke test's P2P decision: ``operations.gpu.smoke.decided_env``)
    + allowed: the addresses beyond loopback the unit admits (``sandbox.reached_from``; None: no IP access list)
    + startup: the host's SGLang also runs its scheduler's startup arithmetic on the new files (the pool, the
      request caps, their assertions), refusing a pool below `min_kv_tokens` (None: one full context)
    """

    def __init__(self, server: Server, inputs: str, restart_when: list[OperationMeta],
                 decided_env: Callable[[], dict[str, str]] | None = None, allowed: tuple[str, ...] | None = (),
                 startup: bool = False, min_kv_tokens: int | None = None):
        self.server, self.inputs, self.restart_when = server, inputs, restart_when
        self.decided_env, self.allowed = decided_env, allowed
        self.startup, self.min_kv_tokens = startup, min_kv_tokens
        self._decision: Decision | None = None

    def decision(self) -> Decision:
        if self._decision is None:
            self._decision = self._decide()
        return self._decision

    def _decide(self) -> Decision:
        s = self.server
        if self.decided_env is not None:
            s = replace(s, engine=replace(s.engine, env={**s.engine.env, **self.decided_env()}))
        unit_text, env_text = unit_files(s, self.inputs, gpu_minor_numbers(), self.allowed)
        current = gathering.read(ServiceState, unit_file=s.unit_file, env_file=s.env_file, service=s.service_name)
        enabled = current["enabled"] == "enabled"
        if (current["unit_sha1"], current["env_sha1"]) != (sha1_of(unit_text.encode()), sha1_of(env_text.encode())):
            # The installed SGLang validates the new files; before the run installs the wanted build
            # (--dry on a fresh host) there is none to ask yet.
            installed = gathering.read(VenvRequirement, path=s.engine.venv, distribution="sglang")
            built = installed and installed["fingerprint"] == fingerprint(s.engine.sglang_requirement,
                                                                           s.engine.service.pip_index_url)
            refused = rejection(host, s, server_args(s), self.startup, self.min_kv_tokens) if built else None
            return Decision(FILES_CHANGED, refused, unit_text, env_text, enabled, new=current["unit_sha1"] is None)
        if any_change(self.restart_when):
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

    + server: the replica's server
    + restart: this run's restart decision of the replica (``Restart``), which a drain before may have asked too

    **Example:**

    .. code:: python

        restart = unit.Restart(server, unit.inputs(server.engine, commits), restart_when=[key])
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
    yield from shell.put(src=StringIO(decision.env_text), dest=s.env_file, user="root", group="root",
                                mode="644")
    yield from shell.put(src=StringIO(decision.unit_text), dest=s.unit_file, user="root", group="root",
                                mode="644")
    yield from systemd.service._inner(service=s.service_name, running=True, restarted=True, enabled=True,
                                      daemon_reload=True)


def restore_command(server: Server) -> str:
    """The one command putting back the unit and environment that served before ``configure`` wrote new
    ones, and restarting it; it fails when there is none to put back."""
    # mv: root renames its own backups in root's directories (ownership.root_directories).
    return " && ".join([
        f"test -f {server.unit_file}{PREVIOUS}",
        *(f"if [ -f {path}{PREVIOUS} ]; then mv -f {path}{PREVIOUS} {path}; fi"
          for path in (server.unit_file, server.env_file)),
        # One command, so the restore cannot stop half-way: daemon-reload and restart, as
        # pyinfra's systemd.service would yield them.
        "systemctl daemon-reload", f"systemctl restart {server.service_name}",
    ])


class ServerUnits(FactBase):
    """
    The SGLang units on the host (PREFIX: the single unit of an earlier layout; PREFIX@*: one a
    replica), each with the port, served model and weights directories its ExecStart names
    (host_scripts/server_units.py).

    .. code:: python

        {"sglang@qwen36_ddtree-gpu0": {"port": 30000, "model": "qwen3.6-27b",
                                       "loads": ["/srv/specfleet/models/Qwen--Qwen3.6-27B/486dd6...", "..."]}}
    """

    host_answer = "server_units.answer"
    default = dict

    def command(self, prefix: str) -> str:
        return inline("server_units", prefix)

    def process(self, output):
        return json.loads("\n".join(output))


def kv_plan_file(config_dir: str, name: str) -> str:
    """Where the unit NAME's KV plan is kept (operations/server/capacity_record.py): root's, beside its
    environment file."""
    return f"{config_dir}/{name}.kv-plan.json"


def unit_paths(config_dir: str, name: str) -> tuple[str, ...]:
    """A unit's files (its environment file beside it), the previous ones kept for its rollback and its KV
    plan."""
    files_of = (f"/etc/systemd/system/{name}.service", f"{config_dir}/{name}.env")
    return (*files_of, *(f"{path}{PREVIOUS}" for path in files_of), kv_plan_file(config_dir, name))


def refusals(restarts: list["Restart"]) -> list[str]:
    """Why the host's SGLang refuses the new files of any of these replicas, one sentence per refusal
    (a deployment's replicas differ in their port and GPUs alone, so SGLang refuses them alike): then
    no unit of the host changes, the retired ones included."""
    refused: dict[tuple[str, str], list[Server]] = {}
    for r in restarts:
        if r.decision().refused:
            refused.setdefault((r.server.engine.venv, r.decision().refused), []).append(r.server)
    return [refused_flags(servers[0], why, [s.service_name for s in servers])
            for (_, why), servers in refused.items()]


class Replacement:
    """
    A change of what the host serves (another profile, layout or replica count) as one change: the SGLang
    units no deployment of the host wants any more are replaced by the wanted ones the run brings in new.
    The replaced units stop before any wanted replica starts (``retired``: they may hold its GPUs or its
    port) and stay restorable, their unit and environment files kept with their virtualenv and weights,
    until every wanted replica generates (``removed``). A new replica that fails readiness stops every
    new one and brings the replaced units back (``restore_command``; readiness.py waits for them to
    generate, then calls ``on_restored``: the gateway subject registers them again where they were drained).

    + service: the host's servers' settings (the unit prefix, the configuration directory)
    + restarts: every wanted replica's restart decision (``Restart``)
    """

    def __init__(self, service: ServiceHost, restarts: list[Restart]):
        self.service, self.restarts = service, restarts
        self.on_restored: list[Callable] = []  # each called (state, host) once the replaced units generate again

    def replaced(self) -> dict[str, dict]:
        """The host's units no deployment wants, as ``ServerUnits`` reads them before the run."""
        wanted = {r.server.service_name for r in self.restarts}
        units = gathering.read(ServerUnits, prefix=self.service.service_prefix) or {}
        return {name: found for name, found in sorted(units.items()) if name not in wanted}

    def new(self) -> list[Server]:
        """The wanted replicas whose unit the host did not have before the run."""
        return [r.server for r in self.restarts if r.decision().new]

    def restore_command(self) -> str:
        """The one command stopping and removing every new replica's unit and starting the replaced ones."""
        new = [s.service_name for s in self.new()]
        replaced = list(self.replaced())
        return " && ".join([
            # A new replica the run has not reached yet has no unit to stop.
            *(f"{{ systemctl disable --now {shlex.quote(name)} 2>/dev/null || true; }}" for name in new),
            # Root's own files in root's directories (ownership.root_directories).
            "rm -f -- " + " ".join(shlex.quote(path) for name in new for path in unit_paths(self.service.config_dir, name)),
            "systemctl daemon-reload",
            f"{{ systemctl reset-failed {' '.join(shlex.quote(f'{name}.service') for name in new)} 2>/dev/null || true; }}",
            f"systemctl enable --now {' '.join(shlex.quote(f'{name}.service') for name in replaced)}",
        ])


@operation()
def retired(replacement: Replacement):
    """
    Stop and disable the SGLang units no deployment of the host wants (``Replacement``): the single unit of
    an earlier layout (``PREFIX.service``) and replicas of another layout or profile. Their files stay until
    every wanted replica generates (``removed``), so a failed change brings them back. Runs before any wanted
    replica (re)starts: a unit named for other GPUs may hold the GPUs or the port a wanted replica takes
    (units of one name always hold the same GPUs, layout.unit_name). If the host's SGLang refuses any wanted
    replica's new files, nothing is stopped and the host fails here.

    + replacement: the host's change of units (``Replacement``), whose restart decisions validate the new files

    **Example:**

    .. code:: python

        unit.retired(name="Units no deployment wants", replacement=unit.Replacement(worker.service, restarts))
    """
    refused = refusals(replacement.restarts)
    if refused:
        yield fail_host(refused)
        return
    stale = list(replacement.replaced())
    if not stale:
        host.noop(f"every SGLang unit on the host is wanted ({len(replacement.restarts)})")
        return
    for name in stale:
        host.log_styled(f"{host.name}: retiring {name} (no deployment wants it any more): stopped, kept until its "
                        "replacement generates", fg="yellow")
        yield from systemd.service._inner(service=name, running=False, enabled=False)


@operation()
def removed(replacement: Replacement):
    """
    Remove the units ``retired`` stopped, once every wanted replica generates: their unit and environment
    files, the previous ones kept for their rollback and their KV plans.

    + replacement: the host's change of units (``Replacement``)

    **Example:**

    .. code:: python

        unit.removed(name="Replaced units removed", replacement=replacement)
    """
    stale = list(replacement.replaced())
    if not stale:
        host.noop("no SGLang unit was replaced")
        return
    for name in stale:
        host.log_styled(f"{host.name}: removing {name} (its replacement generates)", fg="yellow")
    # Root's own files in root's directories (ownership.root_directories).
    yield "rm -f -- " + " ".join(shlex.quote(path) for name in stale
                                 for path in unit_paths(replacement.service.config_dir, name))
    yield from systemd.daemon_reload._inner()
    # A unit that ended failed (its stop killed it) stays listed so until reset: it is gone.
    yield f"systemctl reset-failed {' '.join(shlex.quote(f'{name}.service') for name in stale)} 2>/dev/null || true"


@gathering.wants
def _read(deployment) -> gathering.Wanted:
    return [(ServerUnits, dict(prefix=deployment.engine.service.service_prefix)),
            *((ServiceState, dict(unit_file=s.unit_file, env_file=s.env_file, service=s.service_name))
              for s in deployment.replicas)]
