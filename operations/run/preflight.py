"""Preflight: everything that must hold before a host is changed, each failure naming host, cause and fix.

The rules belong to their subjects (operations/<subject>/checks.py); the host's state is gathered in one
round trip while the hub answers (``host_and_hub_read``), and this operation asks each of them.
"""

import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from pyinfra import host, state
from pyinfra.api import FactBase, operation

from deployment.hosts import Deployment, Host, host_class_of, resolve_worker
from deployment.knobs import BadHostData
from deployment.nodes import group as nodes
from operations.basics import failing, gathering, ownership, shell
from operations.basics.failing import fail_host
from operations.basics.file_states import FileStates
from operations.gpu import checks as gpu_checks
from operations.python import virtualenvs
from operations.server import checks as server_checks, stages as server_stages
from operations.server.unit import ServerUnits
from operations.weights import checks as weights_checks
from operations.weights.checks import HubState


class LoginUser(FactBase):
    """
    Who the deploy's commands run as (through --sudo or --su-user when given), and the SSH login behind sudo.

    .. code:: python

        {"user": "root", "login": "deployer", "sudo": True}
    """

    host_answer = "host_facts.login_user"

    def command(self) -> str:
        return 'echo "$(id -un) ${SUDO_USER:-}"'

    def process(self, output):
        user, _, sudo_user = output[0].strip().partition(" ")
        return {"user": user, "login": sudo_user or user, "sudo": bool(sudo_user)}


def sudo_password_problem(login: str) -> str:
    """A sudo password would be on every escalated command line of the run (`shell.sudo_password`),
    the downloads' polls included, for any local user to read in /proc/*/cmdline."""
    return (f"{host.name}: sudo takes a password from {login}, which pyinfra puts on every command line it runs "
            f"through sudo (readable by every local user): give {login} passwordless sudo (a line '{login} "
            "ALL=(ALL) NOPASSWD: ALL' in /etc/sudoers.d/), then re-run without a sudo password")


def login_problems(login: dict | None, password: bool = False) -> list[str]:
    """The deploy acts as root: through a root login, or a login with pyinfra's --sudo (or --su-user root)
    without a password, which every command of the deploy goes through (operations/basics/shell.py)."""
    if login and login["user"] and password:
        return [sudo_password_problem(login["login"])]
    if not login or not login["user"]:
        return [f"{host.name}: the host did not say which user the deploy runs as (`id -un` printed "
                "nothing): check that the login has a shell and a user name, then re-run"]
    if login["user"] == "root":
        return []
    if login["sudo"]:
        return [f"{host.name}: the deploy runs as {login['user']} through sudo, but it must run as root: "
                "drop --sudo-user"]
    return [f"{host.name}: the deploy logged in as {login['user']}, not root: add --sudo to the pyinfra command "
            "(with passwordless sudo for that user), or log in as root"]


def moving_revisions(deployment: Deployment, hub: HubState) -> tuple[list[str], list[str]]:
    """(problems, warnings): a branch revision or git ref fails the host, unless allow_branch_revisions
    makes it a warning."""
    d = deployment
    moving = [*weights_checks.unpinned(d.weights, hub.snapshots, d.engine.profile_name),
              *server_checks.unpinned_build(d.engine)]
    return ([], moving) if d.allow_branch_revisions else (moving, [])


def wanted_facts(deployments: tuple[Deployment, ...]) -> gathering.Wanted:
    """What every operation of every deployment of the host reads, each fact once."""
    wanted: dict = {}
    for d in deployments:
        for fact, kwargs in gathering.requests(d):
            wanted.setdefault(gathering.key(fact, kwargs), (fact, kwargs))
    return list(wanted.values())


def host_and_hub_read(deployments: tuple[Deployment, ...]) -> list[HubState]:
    """What the hub says of each deployment's repos (``weights.checks.hub_state``), asked on the controller
    while this host's program gathers what every operation reads (``gathering.gather``, one round trip): the
    run waits for the slower of the two, not for both. What the host program reads names no commit, so it
    needs no answer from the hub. A host whose sudo takes a password is not gathered: ``check`` refuses it
    before any command would carry the password.

    **Example:**

    .. code:: python

        hubs = preflight.host_and_hub_read(deployments)
    """
    # A greenlet under pyinfra's CLI (which patches threading): it asks the hub while this one waits on SSH.
    with ThreadPoolExecutor(max_workers=1) as pool:
        asked = pool.submit(lambda: [weights_checks.hub_state(d.weights) for d in deployments])
        if not shell.sudo_password(host):
            gathering.gather(wanted_facts(deployments))
        return asked.result()


@operation()
def check(worker: Host, deployments: tuple[Deployment, ...], hubs: list[HubState]):
    """
    Refuse the host, changing nothing, unless it can serve these deployments.

    Hardware matches the class, the driver suits the pinned SGLang, the token may
    download every repo, each replica's model fits its GPUs at its TP size, the disk
    has room for what is still missing, a DDTree profile has a DDTree build, and the
    service and download users are absent or system users of the deploy's own (``ownership.account_problem``).
    A gated repo whose terms the token's user has not accepted yet refuses a host
    that serves (or did); a host serving nothing yet passes, to be prepared while
    access is pending (``weights.checks.access_pending`` fails it after its downloads started).

    + worker: what is true of the host (``deployment.hosts.resolve_worker``)
    + deployments: the host's resolved deployments, at the hub's commits (``deployment.hosts.at_commits``)
    + hubs: what the hub said of each one's repos, on the controller (``weights.checks.hub_state``)

    **Example:**

    .. code:: python

        hubs = preflight.host_and_hub_read(deployments)
        deployments = tuple(hosts.at_commits(d, hub.commits) for d, hub in zip(deployments, hubs))
        preflight.check(name="Preflight", worker=worker, deployments=deployments, hubs=hubs)
    """
    s = worker.service
    if shell.sudo_password(host):  # refused before any command, the first that would carry it (not gathered)
        yield fail_host([sudo_password_problem(host.data.get("ssh_user") or "the deploy user")], static=True)
        return
    problems = login_problems(gathering.read(LoginUser), shell.sudo_password(host))  # one prompted for then
    for knob, user, home in (("service_user", s.service_user, s.service_home),
                             *((f"deployments[{e.name!r}]'s user", e.user, e.home)
                               for e in server_stages.deployment_users(tuple(d.engine for d in deployments))),
                             ("download_user", s.download_user, s.download_home)):
        account = ownership.account_problem(user, home, gathering.read(ownership.SystemUser, user=user))
        problems += [f"{host.name}: {knob}={user!r}: {account}"] if account else []
    problems += list(dict.fromkeys(f"{host.name}: {problem}" for hub in hubs for problem in hub.problems))
    gpu_problems, gpus = gpu_checks.hardware_problems(worker.gpu)
    problems += gpu_problems
    read = [(d, hub) for d, hub in zip(deployments, hubs) if hub.snapshots]
    planned = {}  # per deployment, what its replicas' KV plan says
    for d, hub in read:  # the repos the token may read; one waiting for access is checked on the run after
        for replica in d.replicas:
            weights = server_checks.memory_problems(replica, worker.gpu.expected, d.weights.target.repo_id,
                                                    hub.weight_bytes, gpus)
            if not weights and "target" in hub.snapshots:
                weights, planned[d.name] = server_checks.kv_capacity(replica, worker.gpu.expected, hub.snapshots,
                                                                     gpus, worker.min_kv_tokens)
            problems += weights
    if read:
        disk = {}
        for d, _ in read:
            disk.update(weights_checks.disk_state(d.weights) or {})
        problems += weights_checks.disk_problems([(d.weights, hub.snapshots) for d, hub in read], disk)
    problems += virtualenvs.python_problems(host.name, gathering.read(virtualenvs.HostPython, uv=virtualenvs.Uv(s.install_dir).binary))
    for d in deployments:
        problems += server_checks.rule_problems(d.replicas[0]) + server_checks.unreleased_problems(d.replicas[0])
    key_file = gathering.read(FileStates, paths=(s.api_key_file,)).get(s.api_key_file)
    problems += server_checks.exposure_problems(s, bool(os.environ.get(s.api_key_env)), key_file is not None)
    warnings = []
    for d, hub in zip(deployments, hubs):
        moving, warned = moving_revisions(d, hub)
        problems += [f"{host.name}: {sentence}" for sentence in moving]
        warnings += warned
    waiting = [f"{host.name}: {problem}" for hub in hubs for problem in hub.pending]
    # A host that serves is never touched while a repo waits for access: its servers keep running as they are.
    if waiting and (problems or gathering.read(ServerUnits, prefix=s.service_prefix)):
        problems += waiting
    if problems:
        yield from failing.failed(problems)
        return
    for warning in warnings:
        host.log_styled(f"{host.name}: {warning}", fg="yellow")
    if waiting:
        pending = [r.repo_id for d, hub in zip(deployments, hubs) for r in d.weights.repos
                   if r.role not in hub.snapshots]
        host.log_styled(f"{host.name}: serves nothing yet and waits for access to {', '.join(pending)}: "
                        "preparing everything else and starting the downloads it may read; it fails once they "
                        "are started", fg="yellow")
    found = f"{len(gpus)}x {gpus[0]['name']}" if gpus else "no driver yet"
    served = "; ".join(f"{d.name}: {len(d.replicas)} x TP {d.engine.tp_size} "
                       f"({weights_checks.described(d.weights, hub.snapshots)}"
                       + (f"; {planned[d.name]} a replica" if d.name in planned else "") + ")"
                       for d, hub in zip(deployments, hubs))
    passed = f"preflight passed: {found} as {worker.host_class}; {served}"
    if not state.is_executing:  # detecting changes (--dry), where pyinfra prints no noop: the plan is said here
        host.log_styled(passed)  # not "HOST: ...", the form of a refusal
    host.noop(passed)


def refuse(problem: str) -> None:
    """Refuse this host with one sentence, changing nothing: its data cannot be deployed (a bad knob, an
    unknown profile, class or attention kind). The other hosts go on.

    Said as the deploy file is read, whatever the flags (`--dry -y` too), and counted among pyinfra's
    failed hosts, so the run exits non-zero (failing.refuse_at_load). The host stays in the run with
    nothing prepared but `refused` and the summary: with every host refused, the summary still says why.

    **Example:**

    .. code:: python

        preflight.refuse(problem="ct200: install_driver='maybe' is not a boolean: ...")
    """
    failing.refuse_at_load([problem])
    refused(problem=problem)


def resolved(inventory, plan_of: Callable[[Any], Any]) -> tuple[Host | None, tuple[Deployment, ...], Any]:
    """This host's worker, its deployments and `plan_of(host.data)` (what a bench or a tune was asked), for a
    deploy file that serves what the host runs; a value that cannot be deployed refuses the host in one
    sentence, said once as the file is read (failing.refuse_at_load: a bench or a tune has no summary to end
    with, so no operation repeats it), and the host gets (None, (), None).

    **Example:**

    .. code:: python

        worker, deployments, plan = preflight.resolved(inventory, bench_plan)
    """
    try:
        worker, deployments = resolve_worker(host.data, host_class_of(host.groups), nodes.members(inventory, host))
        return worker, deployments, plan_of(host.data)
    except BadHostData as problem:
        failing.refuse_at_load([f"{host.name}: {problem}"])
        return None, (), None


@operation()
def refused(problem: str):
    """
    Change nothing on a host `refuse` refused (it said why, and the host counts as failed).

    + problem: the sentence: host, what is wrong, what is accepted
    """
    host.noop(f"refused, nothing changed: {problem}")
    return
    yield  # an operation is a generator


@gathering.wants
def _read(deployment) -> gathering.Wanted:
    return [(LoginUser, {})]
