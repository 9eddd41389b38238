"""What the deploy laid down on a host, and its removal (uninstall.py): units, users, virtualenvs, keys and
token, Prometheus's targets; the weights only when asked.

The SGLang units leave the gateways and go first through the server subject's own retirement (a host
whose data wants no replica retires every unit: workers.drain_retired, unit.retired); this module
removes the rest. Everything removed is named by the host's resolved data (knobs.py validated each
path) or found by the deploy's own unit names, and read in one fact before anything is removed.
"""

import posixpath
import shlex
from dataclasses import dataclass

from pyinfra import host
from pyinfra.api import FactBase, operation

from operations.basics import knobs
from operations.gateway.config import Gateway
from operations.monitoring import prometheus
from operations.python import venv
from operations.server.config import Server, ServiceHost

WEIGHTS_UNITS = "/etc/systemd/system/specfleet-weights-*.service"  # weights.config Repo.unit_name


@dataclass(frozen=True)
class Uninstall:
    """What the host's data says the deploy laid down there."""

    directories: tuple[str, ...]  # removed whole: install_dir (venvs, host programs, uv), config_dir (keys, env files)
    users: tuple[str, ...]  # the service, deployments', download and build users, with their homes (the HF token is in the download user's)
    gateway_unit: str | None  # smg's unit
    weights_dir: str | None  # None: the weights are kept


def plan(service: ServiceHost | None, gateway: Gateway | None, weights_dir: str, remove_weights: bool,
         replicas: tuple[Server, ...] = ()) -> Uninstall:
    """The host's Uninstall; `replicas`: the host's, whose users go too (each deployment's own on a host of
    several, config.deployment_user). A directory of one component (/opt, /srv) is refused, never removed whole: the deploy makes its own
    directories, which a misset knob could point at a system one."""
    directories = sorted(({service.install_dir, service.config_dir} if service else set())
                         | ({gateway.install_dir, gateway.config_dir} if gateway else set()))
    for name, path in [*(("install_dir or config_dir", d) for d in directories),
                       *([("weights_dir", weights_dir)] if remove_weights else [])]:
        if path.count("/") < 2:
            raise knobs.refused(name, path, "uninstall removes only a directory of its own, at least two levels "
                                "deep (e.g. /opt/specfleet)", wrong="is not removed whole")
    # The build user whatever the requirements say now: an earlier requirement may have been a git build.
    users = sorted(({service.service_user, service.download_user, *(r.engine.user for r in replicas)}
                    if service else set()) | ({gateway.user} if gateway else set()) | {venv.BUILD_USER})
    return Uninstall(tuple(directories), tuple(users), gateway.unit_file if gateway else None,
                     weights_dir if remove_weights else None)


class Leftovers(FactBase):
    """
    Which of the paths and users exist on the host, and its weights download units.

    .. code:: python

        {"paths": ["/opt/specfleet", "/etc/specfleet"], "users": ["sglang"],
         "units": ["specfleet-weights-moonshotai--Kimi-K2.6"]}
    """

    @staticmethod
    def default() -> dict:  # nothing printed: nothing found
        return {"paths": [], "users": [], "units": []}

    def command(self, paths: tuple[str, ...], users: tuple[str, ...]) -> str:
        return "; ".join([
            *(f"[ -e {shlex.quote(p)} ] && echo path {shlex.quote(p)}" for p in paths),
            *(f"getent passwd {shlex.quote(u)} >/dev/null && echo user {shlex.quote(u)}" for u in users),
            f"for f in {WEIGHTS_UNITS}; do [ -e \"$f\" ] && echo unit \"$f\"; done", "true"])

    def process(self, output):
        found = {"paths": [], "users": [], "units": []}
        for line in output:
            kind, _, value = line.partition(" ")
            found[f"{kind}s"].append(posixpath.basename(value)[:-len(".service")] if kind == "unit" else value)
        return found


def candidates(u: Uninstall) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(the paths, the users) a Leftovers fact is asked about."""
    paths = (*u.directories, *([u.gateway_unit] if u.gateway_unit else []), prometheus.CONFINEMENT_FILE,
             prometheus.CONFIG_FILE, prometheus.KEY_FILE, *([u.weights_dir] if u.weights_dir else []))
    return paths, u.users


def removals(u: Uninstall, left: dict) -> list[str]:
    """The commands removing what `left` (a Leftovers fact) still holds of `u`, in order: units stop first
    (a unit's process holds its files), then Prometheus's targets, the users and their homes, the directories."""
    paths, users = set(left["paths"]), [user for user in u.users if user in left["users"]]
    units = [*left["units"], *([posixpath.basename(u.gateway_unit)[:-len(".service")]]
                               if u.gateway_unit in paths else [])]
    commands = []
    if units:
        named = " ".join(shlex.quote(f"{unit}.service") for unit in units)
        commands += [f"systemctl disable --now {named}",
                     "rm -f -- " + " ".join(shlex.quote(f"/etc/systemd/system/{unit}.service") for unit in units)]
    if prometheus.CONFINEMENT_FILE in paths:  # the deploy's Prometheus: its targets (and their key) go
        gone = [p for p in (prometheus.CONFINEMENT_FILE, prometheus.CONFIG_FILE, prometheus.KEY_FILE) if p in paths]
        commands += [f"systemctl disable --now {prometheus.SERVICE}", "rm -f -- " + " ".join(map(shlex.quote, gone))]
    if units or prometheus.CONFINEMENT_FILE in paths:
        commands += ["systemctl daemon-reload",
                     f"systemctl reset-failed {' '.join(shlex.quote(f'{unit}.service') for unit in units)} "
                     "2>/dev/null || true"]
    commands += [f"userdel --remove {shlex.quote(user)} 2>/dev/null || userdel {shlex.quote(user)}" for user in users]
    gone = [d for d in (*u.directories, *([u.weights_dir] if u.weights_dir else [])) if d in paths]
    if gone:
        commands.append("rm -rf -- " + " ".join(map(shlex.quote, gone)))
    return commands


@operation()
def removed(uninstall: Uninstall):
    """
    Remove what the deploy laid down that is still on the host (``removals``), after the SGLang units'
    retirement: the weights download units and smg's, Prometheus's targets (Debian's package stays,
    stopped), the service and download users with their homes (the HF token is the download user's), the install and config directories
    with the virtualenvs and keys; the weights only with ``remove_weights``.

    + uninstall: what the host's data says the deploy laid down (``plan``)

    **Example:**

    .. code:: python

        uninstall.removed(name="What the deploy laid down", uninstall=uninstall.plan(service, None, "/srv/m", False))
    """
    paths, users = candidates(uninstall)
    commands = removals(uninstall, host.get_fact(Leftovers, paths=paths, users=users))
    if not commands:
        host.noop("nothing the deploy laid down is left")
    for command in commands:
        yield command
