"""What the deploy laid down on a host, and its removal (uninstall.py): units, users, virtualenvs, keys and
token, Prometheus's targets, the fan-out's nginx; the weights only when asked.

The SGLang units leave the gateways and go first through the server subject's own retirement (a host
whose data wants no replica retires every unit: workers.drain_retired, unit.retired); this module
removes the rest. What the host's resolved data names (knobs.py validated each path) is read in one fact
(``Leftovers``) before anything is removed, and removed only where it carries the mark the deploy wrote:
an account's comment, a directory's mark file (operations/basics/ownership.py). A named account the deploy
would refuse, or a named account or directory without the mark, refuses the host (``problem``), so a knob
pointed elsewhere (`service_user=postgres`, `config_dir=/etc/ssl`) removes nothing. Every account that
carries the mark goes, named or not (a deployment's user that an earlier layout of the host used).
"""

import posixpath
import shlex
from dataclasses import dataclass

from pyinfra import host
from pyinfra.api import FactBase, operation

from deployment import knobs
from deployment.gateway.config import Gateway
from deployment.server.config import Server, ServiceHost
from operations.basics import ownership
from operations.basics.host_scripts.host_facts import ACCOUNT_MARK
from operations.monitoring import prometheus
from operations.weights import peer

WEIGHTS_UNITS = "/etc/systemd/system/specfleet-weights-*.service"  # weights.config Repo.unit_name, peer.UNIT
NGINX_UNIT = "/etc/systemd/system/nginx.service"  # masked (a link to /dev/null) by peer.package
# What `apt-get install nginx` (peer.PACKAGES) brings of nginx's own on Debian 12 (nginx-core beside nginx)
# and 13: the packages purged where the deploy installed it.
NGINX_PACKAGES = ("nginx", "nginx-core", "nginx-common")


@dataclass(frozen=True)
class Uninstall:
    """What the host's data says the deploy laid down there."""

    directories: tuple[str, ...]  # removed whole: install_dir (venvs, host programs, uv), config_dir (keys, env files)
    users: tuple[tuple[str, str], ...]  # (user, the home the deploy gives it): the service, deployments', download and gateway users
    gateway_unit: str | None  # smg's unit
    weights_dir: str | None  # the host's weights (None: a host without, a gateway's)
    weights_owner: str | None  # who deletes them (the download user)
    remove_weights: bool  # False: the weights stay
    peer_dir: str | None  # the fan-out's nginx configuration, removed where it carries the mark (which also says the deploy installed nginx)


def plan(service: ServiceHost | None, gateway: Gateway | None, weights_dir: str, remove_weights: bool,
         replicas: tuple[Server, ...] = ()) -> Uninstall:
    """The host's Uninstall; `replicas`: the host's, whose users go too (each deployment's own on a host of
    several, config.deployment_user). A directory of one component (/opt, /srv) is refused, never removed
    whole: the deploy makes its own directories, which a misset knob could point at a system one."""
    peer_dir = peer.conf_dir_beside(service.config_dir) if service else None
    directories = sorted(({service.install_dir, service.config_dir} if service else set())
                         | ({gateway.install_dir, gateway.config_dir} if gateway else set()))
    for name, path in [*(("install_dir or config_dir", d) for d in directories),
                       *([("weights_dir", weights_dir)] if remove_weights and service else [])]:
        if path.count("/") < 2:
            raise knobs.refused(name, path, "uninstall removes only a directory of its own, at least two levels "
                                "deep (e.g. /opt/specfleet)", wrong="is not removed whole")
    users = sorted(({(service.service_user, service.service_home), (service.download_user, service.download_home),
                     *((r.engine.user, r.engine.home) for r in replicas)} if service else set())
                   | ({(gateway.user, gateway.home)} if gateway else set()))
    return Uninstall(tuple(directories), tuple(users), gateway.unit_file if gateway else None,
                     weights_dir if service else None, service.download_user if service else None,
                     remove_weights and service is not None, peer_dir)


class Leftovers(FactBase):
    """
    What of an Uninstall is on the host: each path that exists and each directory holding the deploy's
    mark; each named account and each account carrying the deploy's mark (their passwd entries); the
    weights download units; whether nginx.service is masked and which of nginx's packages are installed;
    the directories `owner` owns in `weights_dir` (its repos).

    .. code:: python

        {"paths": ["/opt/specfleet", "/etc/specfleet"], "marked": ["/opt/specfleet", "/etc/specfleet"],
         "accounts": {"sglang": {"uid": 998, "home": "/home/sglang", "shell": "/usr/sbin/nologin",
                                 "marked": True}},
         "units": ["specfleet-weights-moonshotai--Kimi-K2.6"], "nginx": ["nginx", "nginx-common"],
         "nginx_masked": True, "weights": ["/srv/specfleet/models/moonshotai--Kimi-K2.6"]}
    """

    @staticmethod
    def default() -> dict:  # nothing printed: nothing found
        return {"paths": [], "marked": [], "accounts": {}, "units": [], "nginx": [], "nginx_masked": False,
                "weights": []}

    def command(self, paths: tuple[str, ...], directories: tuple[str, ...], users: tuple[str, ...],
                weights_dir: str | None = None, owner: str | None = None) -> str:
        mark = shlex.quote(ownership.DIRECTORY_MARK)
        return "; ".join([
            *(f"[ -e {shlex.quote(p)} ] && echo path {shlex.quote(p)}" for p in paths),
            # The mark is root's plain file, not a link: root wrote it there (ownership.marked).
            *(f"[ -f {shlex.quote(d)}/{mark} ] && [ ! -L {shlex.quote(d)}/{mark} ] && "
              f"[ \"$(stat -c %U {shlex.quote(d)}/{mark})\" = root ] && echo marked {shlex.quote(d)}"
              for d in directories),
            *(f"getent passwd {shlex.quote(u)} | sed 's/^/account /'" for u in users),
            f"getent passwd | awk -F: '$5 == \"{ACCOUNT_MARK}\" {{print \"account \" $0}}'",
            f"for f in {WEIGHTS_UNITS}; do [ -e \"$f\" ] && echo unit \"$f\"; done",
            f"[ \"$(readlink {NGINX_UNIT})\" = /dev/null ] && echo nginx-masked",
            "dpkg-query -W -f '${db:Status-Abbrev} ${Package}\\n' " + " ".join(NGINX_PACKAGES) +
            " 2>/dev/null | awk '$1 == \"ii\" {print \"nginx \" $2}'",
            *([f"find {shlex.quote(weights_dir)} -mindepth 1 -maxdepth 1 -type d -user {shlex.quote(owner)} "
               "-printf 'weights %p\\n' 2>/dev/null"] if weights_dir and owner else []),
            "true"])

    def process(self, output):
        found = self.default()
        for line in output:
            kind, _, value = line.partition(" ")
            if kind == "account":
                name, _, uid, _, gecos, home, shell = value.split(":")
                found["accounts"][name] = {"uid": int(uid), "home": home, "shell": shell or None,
                                           "marked": gecos == ACCOUNT_MARK}
            elif kind == "unit":
                found["units"].append(posixpath.basename(value)[:-len(".service")])
            elif kind in ("path", "marked", "nginx", "weights"):
                found["paths" if kind == "path" else kind].append(value)
            elif kind == "nginx-masked":
                found["nginx_masked"] = True
        return found


def asked(u: Uninstall) -> dict:
    """The Leftovers fact's arguments for `u`."""
    directories = (*u.directories, *([u.peer_dir] if u.peer_dir else []))
    paths = (*directories, *([u.gateway_unit] if u.gateway_unit else []), prometheus.CONFINEMENT_FILE,
             prometheus.CONFIG_FILE, prometheus.KEY_FILE)
    return dict(paths=paths, directories=directories, users=tuple(user for user, _ in u.users),
                **(dict(weights_dir=u.weights_dir, owner=u.weights_owner) if u.remove_weights else {}))


def problem(u: Uninstall, left: dict) -> str | None:
    """Why uninstall removes nothing from the host, in one sentence: an account its data names that the deploy
    would refuse to take (``ownership.account_problem``, the deploy's own check), or a named account or
    directory that exists without the deploy's mark; None when everything named is the deploy's or absent."""
    for user, home in u.users:
        existing = left["accounts"].get(user)
        why = ownership.account_problem(user, home, existing)
        if why:
            return f"{why}; uninstall removes nothing"
        if existing and not existing["marked"]:
            return (f"the account {user} carries no comment {ACCOUNT_MARK!r}, the mark of an account the deploy made: "
                    "uninstall removes nothing (name the deploy's own user; a host deployed before the mark gets it "
                    "from one deploy)")
    for directory in u.directories:
        if directory in left["paths"] and directory not in left["marked"]:
            return (f"{directory} holds no {ownership.DIRECTORY_MARK}, the mark the deploy writes in each directory it "
                    "makes: uninstall removes nothing (fix install_dir or config_dir; a host deployed before the "
                    "mark gets it from one deploy)")
    return None


def removed_accounts(left: dict) -> list[str]:
    """Every account on the host that carries the deploy's mark, by name."""
    return sorted(name for name, account in left["accounts"].items() if account["marked"])


def removed_directories(u: Uninstall, left: dict) -> list[str]:
    """The directories removed whole: those the host's data names (a ``problem`` where one is not marked) and
    the peer server's where it is marked (an earlier deploy's may not be: it stays)."""
    return [d for d in (*u.directories, *([u.peer_dir] if u.peer_dir else []))
            if d in left["paths"] and (d != u.peer_dir or d in left["marked"])]


def nginx_installed_by_the_deploy(u: Uninstall, left: dict) -> bool:
    """nginx is masked (peer.package masks it before installing it) and the fan-out's directory carries the
    deploy's mark: a site's own nginx is neither."""
    return bool(left["nginx"]) and left["nginx_masked"] and u.peer_dir in left["marked"]


def removals(u: Uninstall, left: dict) -> list[str]:
    """The commands removing what `left` (a Leftovers fact without a ``problem``) still holds of `u`, in order:
    units stop first (a unit's process holds its files), then Prometheus's targets, the deploy's nginx, the
    weights (deleted by their owner), the accounts and their homes, the directories."""
    paths = set(left["paths"])
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
    if nginx_installed_by_the_deploy(u, left):
        # Purged, then unmasked: unmasked and installed, Debian's nginx.service would serve /var/www on port 80.
        commands += ["DEBIAN_FRONTEND=noninteractive apt-get purge -y -q " + " ".join(left["nginx"]),
                     "systemctl unmask nginx.service"]
    if u.remove_weights and left["weights"] and u.weights_owner in left["accounts"]:
        # Each repo's contents by their owner, as the deploy deletes a revision: root acts inside no directory
        # another user writes; then root removes the emptied repo directories (in its own weights_dir) and
        # weights_dir where nothing else is left. From /: find returns to its starting directory, which
        # root's (/root) is not to the owner.
        repos = " ".join(map(shlex.quote, left["weights"]))
        commands += [f"cd / && runuser -u {shlex.quote(u.weights_owner)} -- find {repos} -mindepth 1 -delete",
                     f"rmdir -- {repos}", f"rmdir -- {shlex.quote(u.weights_dir)} 2>/dev/null || true"]
    commands += [f"userdel --remove {shlex.quote(user)} 2>/dev/null || userdel {shlex.quote(user)}"
                 for user in removed_accounts(left)]
    gone = removed_directories(u, left)
    if gone:
        commands.append("rm -rf -- " + " ".join(map(shlex.quote, gone)))
    return commands


def summary(u: Uninstall, left: dict, sglang_prefix: str | None) -> str:
    """What goes, as the operation's name (pyinfra shows it before it asks), and whether the weights stay;
    `sglang_prefix`: the host's SGLang units' (`service_name`), which are retired before, or None."""
    gone = [*([f"every SGLang unit ({sglang_prefix}, {sglang_prefix}@*)"] if sglang_prefix else []),
            *([f"the units {', '.join(left['units'])}"] if left["units"] else []),
            *(["smg's unit"] if u.gateway_unit in left["paths"] else []),
            *(["Prometheus's targets"] if prometheus.CONFINEMENT_FILE in left["paths"] else []),
            *(["the fan-out's nginx"] if nginx_installed_by_the_deploy(u, left) else []),
            *([f"the weights in {u.weights_dir}"] if u.remove_weights and left["weights"] else []),
            *([f"the accounts {', '.join(removed_accounts(left))} with their homes"] if removed_accounts(left) else []),
            *([f"the directories {', '.join(removed_directories(u, left))}"] if removed_directories(u, left) else [])]
    said = f"Remove {'; '.join(gone)}" if gone else "Nothing the deploy laid down is left"
    if u.weights_dir and not u.remove_weights:
        said += f"; the weights in {u.weights_dir} stay (remove_weights=true removes them)"
    return said


@operation()
def removed(uninstall: Uninstall):
    """
    Remove what the deploy laid down that is still on the host (``removals``), after the SGLang units'
    retirement: the weights download units and smg's, Prometheus's targets (Debian's package stays,
    stopped), the fan-out's nginx, every account the deploy marked with its home (the HF token is the
    download user's), the install and config directories with the virtualenvs and keys; the weights
    only with ``remove_weights``, deleted by their owner. A host with a ``problem`` fails, unchanged.

    + uninstall: what the host's data says the deploy laid down (``plan``)

    **Example:**

    .. code:: python

        uninstall.removed(name="What the deploy laid down", uninstall=uninstall.plan(service, None, "/srv/m", False))
    """
    left = host.get_fact(Leftovers, **asked(uninstall))
    commands = removals(uninstall, left)
    if not commands:
        host.noop("nothing the deploy laid down is left")
    for command in commands:
        yield command
