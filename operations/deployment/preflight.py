"""Preflight: everything that must hold before a host is changed, each failure naming host, cause and fix."""

import json
import os
import re
from concurrent.futures import ThreadPoolExecutor

import httpx2
from huggingface_hub.errors import HfHubHTTPError
from pyinfra import host
from pyinfra.api import FactBase, operation

from operations.deployment.config import COMMIT, Deployment, Repo
from operations.basics.failing import fail_host
from operations.basics import gathering
from operations.basics.file_states import FileStates
from operations.gpu.checks import check_fabric, check_gpu_class
from operations.gpu import packages
from operations.gpu.facts import NvidiaFabric, NvidiaHost
from operations.gpu.nvidia import host_release
from operations.basics.host_programs import inline
from operations.weights.hub import AccessPending, HubProblem, RepoSnapshot, controller_token, snapshot, whoami
from operations.basics.units import ServiceState
from operations.server.flags import rejection, server_args
from operations.python import venv
from operations.python.venv import VenvRequirement, fingerprint

GIB = 1 << 30
# A release pin; DDTree (open PR #29907) is in no SGLang release up to 0.5.23.
RELEASE_PIN = re.compile(r"^sglang\s*(==|~=|>=|<=|<|>|===)")
DDTREE_BUILD = "sglang @ git+https://github.com/sgl-project/sglang@COMMIT#subdirectory=python"
GIT_REVISION = re.compile(r"git\+\S+?@([^#\s]+)")  # the ref after @ in 'name @ git+URL@REF#...'
# What the hub answers when it is down or broken: no connection, a timeout, a 5xx.
HUB_OUTAGES = (httpx2.HTTPError, HfHubHTTPError, OSError)

class WeightsDisk(FactBase):
    """
    Per weights directory: free bytes on its filesystem, the filesystem's device, and files present
    (host_scripts/weights_disk.py).

    .. code:: python

        {"/srv/specfleet/models/moonshotai--Kimi-K2.6":
            {"free": 636707266560, "device": 2049, "checked": "/srv", "files": {"config.json": 3512}}}
    """

    host_answer = "weights_disk.answer"

    def command(self, local_dirs: tuple[str, ...]) -> str:
        return inline("weights_disk", *local_dirs)

    def process(self, output):
        return json.loads("\n".join(output))


class LoginUser(FactBase):
    """
    The user the SSH session logged in as, and whether the deploy's commands run through sudo.

    .. code:: python

        {"user": "deployer", "sudo": True}
    """

    host_answer = "host_facts.login_user"

    def command(self) -> str:
        return 'echo "${SUDO_USER:-$(id -un)} ${SUDO_USER:+sudo}"'

    def process(self, output):
        user, _, sudo = output[0].partition(" ")
        return {"user": user, "sudo": sudo == "sudo"}


def login_problems(login: dict) -> list[str]:
    """The deploy logs in as root: its progress polls, readiness probe, journal reads and rollback run
    on the SSH session itself, where pyinfra's --sudo does not reach, so another user would fail halfway."""
    if not login:
        return [f"{host.name}: the host did not say which user the deploy logged in as (`id -un` printed "
                "nothing): check that the login has a shell and a user name, then re-run"]
    if login["user"] == "root" and not login["sudo"]:
        return []
    how = f"{login['user']} through sudo" if login["sudo"] else login["user"]
    return [f"{host.name}: the deploy logged in as {how}, but it must log in as root (its readiness checks, "
            "journal reads and rollback run outside sudo): connect as root (`User root` in your SSH config, "
            "or SPECFLEET_SSH_USER=root) with a key only you hold"]


def hub_snapshots(deployment: Deployment) -> tuple[dict[str, RepoSnapshot], list[str], list[str]]:
    """On the controller: the token works and may download every repo; each repo's commit and files.

    Returns the snapshots of the repos the token may read, the problems that stop the host before
    any change, and the gated repos whose terms the token's user has not accepted yet (``check``
    lets a host serving nothing yet be prepared while those wait: see ``access_pending``).
    """
    d = deployment
    endpoint = d.hf_endpoint or "https://huggingface.co"
    token = controller_token(d.hf_token_env)
    try:
        whoami(d.hf_endpoint, token)
    except HubProblem as problem:
        return {}, [str(problem)], []
    except HUB_OUTAGES as error:
        return {}, [_outage(endpoint, error)], []

    def one(repo):
        try:
            return snapshot(d.hf_endpoint, token, repo.repo_id, repo.revision)
        except AccessPending as waiting:  # before HubProblem, which it is
            return waiting
        except HubProblem as problem:
            return str(problem)
        except HUB_OUTAGES as error:
            return _outage(f"{endpoint}/{repo.repo_id}", error)

    snapshots, problems, pending = {}, [], []
    # The repos' hub calls at once: the run waits for the slowest repo, not for their sum.
    with ThreadPoolExecutor(max_workers=len(d.repos)) as pool:
        for repo, outcome in zip(d.repos, pool.map(one, d.repos)):
            if isinstance(outcome, RepoSnapshot):
                snapshots[repo.role] = outcome
            elif isinstance(outcome, AccessPending):
                pending.append(str(outcome))
            else:
                problems.append(outcome)
    return snapshots, problems, pending


def _outage(where: str, error: Exception) -> str:
    cause = " ".join(str(error).split())[:200] or type(error).__name__
    return (f"the hub at {where} did not answer as a hub does ({type(error).__name__}: {cause}): check the "
            "network and hf_endpoint, then re-run (nothing was changed)")


def _gb(size: int) -> str:
    return f"{size / 1e9:.1f} GB ({size} bytes)"


def memory_problems(deployment: Deployment, snapshots: dict[str, RepoSnapshot], gpus: list | None) -> list[str]:
    d = deployment
    per_card_mib = min((g.get("memory_total_mib") or 0 for g in gpus or []), default=d.expected_gpus.min_memory_mib)
    usable = per_card_mib * (1 << 20) * d.mem_fraction_static
    weights = sum(s.weight_bytes for s in snapshots.values())
    per_gpu = weights / d.tp_size
    if per_gpu <= usable:
        return []
    return [f"{host.name}: {d.target.repo_id} and its drafter need {per_gpu / GIB:.1f} GiB of weights per GPU "
            f"at TP {d.tp_size}, but each GPU offers {usable / GIB:.1f} GiB (mem_fraction_static "
            f"{d.mem_fraction_static} of {per_card_mib} MiB): use a class with more GPU memory, a larger TP "
            "or a quantized checkpoint"]


def disk_problems(deployment: Deployment, snapshots: dict[str, RepoSnapshot], disk: dict) -> list[str]:
    """Bytes still missing per filesystem (plus one shard of headroom for a partial file) against free bytes."""
    repos = [r for r in deployment.repos if r.role in snapshots]  # a repo waiting for access: next run
    unknown = [r.local_dir for r in repos if not (disk or {}).get(r.local_dir)]
    if unknown:
        return [f"{host.name}: the host did not say how much room {', '.join(unknown)} has (its disk check "
                "printed nothing; it needs python3 on the host): install python3, then re-run"]
    needs: dict[int, list] = {}
    for repo in repos:
        on_disk, snap = disk[repo.local_dir], snapshots[repo.role]
        missing = [f.size for f in snap.files if on_disk["files"].get(f.path) != f.size]
        need = needs.setdefault(on_disk["device"], [0, 0, on_disk["free"], on_disk["checked"], []])
        need[0] += sum(missing)
        need[1] = max([need[1], *missing])
        need[4].append(repo.local_dir)
    return [
        f"{host.name}: the weights need {_gb(missing)} more in {', '.join(dirs)} (+ {_gb(headroom)} headroom "
        f"for a partial file), but the filesystem holding {checked} has {_gb(free)} free: free space there "
        "or point weights_dir at a larger disk"
        for missing, headroom, free, checked, dirs in needs.values()
        if missing and missing + headroom > free
    ]


def ddtree_problems(deployment: Deployment) -> list[str]:
    """DDTree needs an SGLang build that has it; the installed one must accept its flags."""
    d = deployment
    if d.speculative.algorithm != "DDTREE":
        return []
    if RELEASE_PIN.match(d.sglang_requirement):
        return [f"{host.name}: profile {d.profile_name} uses DDTree, but {d.sglang_requirement} is a release and "
                "no SGLang release up to 0.5.23 has DDTree (it is in open pull request #29907): set "
                f"profiles['{d.profile_name}']['sglang']['requirement'] to a build that has it, e.g. "
                f"'{DDTREE_BUILD}' with the pull request's commit, or a wheel path/URL"]
    installed = gathering.read(VenvRequirement, path=d.venv, distribution="sglang")
    if not installed or installed["fingerprint"] != fingerprint(d.sglang_requirement, d.pip_index_url):
        return []  # not installed yet (no venv on a fresh host): the unit's validation checks it before any restart
    rejected = rejection(host, d, server_args(d))
    if rejected:
        return [f"{host.name}: the SGLang installed from {d.sglang_requirement} rejects the DDTree flags "
                f"({rejected}): point the profile's sglang requirement at a DDTree build (PR #29907)"]
    return []


def unpinned(deployment: Deployment, snapshots: dict[str, RepoSnapshot]) -> list[str]:
    """A sentence per repo whose revision is a branch or tag: its weights follow whatever it points at."""
    return [f"{repo.repo_id}: revision {repo.revision!r} is not a commit; it resolves to "
            f"{snapshots[repo.role].commit} now: pin that commit in group_data (profiles"
            f"['{deployment.profile_name}']['{repo.role}']['revision']) for reproducible weights, or set "
            "allow_branch_revisions=true to follow the branch"
            for repo in deployment.repos if repo.role in snapshots and not COMMIT.match(repo.revision)]


def unpinned_builds(deployment: Deployment) -> list[str]:
    """A sentence per git requirement that names a branch, tag or pull-request ref instead of a commit."""
    d = deployment
    return [f"{d.sglang_requirement}: {ref!r} is not a commit, so what is installed can change under the same "
            f"name: pin a 40-hex commit (for a pull request: `git ls-remote URL {ref}`), or set "
            "allow_branch_revisions=true"
            for ref in GIT_REVISION.findall(d.sglang_requirement) if not COMMIT.match(ref)]


def moving_revisions(deployment: Deployment, snapshots: dict[str, RepoSnapshot]) -> tuple[list[str], list[str]]:
    """(problems, warnings): a branch revision or git ref fails the host, unless allow_branch_revisions
    makes it a warning."""
    moving = [*unpinned(deployment, snapshots), *unpinned_builds(deployment)]
    return ([], moving) if deployment.allow_branch_revisions else (moving, [])


def exposure_problems(deployment: Deployment, key_on_controller: bool, key_on_host: bool) -> list[str]:
    """A server reachable beyond loopback never runs without an API key."""
    d = deployment
    keyed = key_on_controller or (key_on_host and not d.remove_api_key)
    if not d.exposed or (keyed and not d.remove_api_key):
        return []
    why = "remove_api_key is set" if d.remove_api_key else \
        f"${d.api_key_env} is not set on the controller and the host has no key"
    return [f"{host.name}: the server would listen on {d.bind_address}:{d.port}, beyond loopback, without an "
            f"API key ({why}): export {d.api_key_env} on the controller (the server then requires it), or "
            "set bind_address=127.0.0.1 and reach it through a gateway on the host"]


def serves(service: dict) -> bool:
    """The host serves this deployment, or did: its SGLang unit is written, or the service runs."""
    return service["unit_sha1"] is not None or service["active"] in ("active", "activating", "reloading")


def _described(repo: Repo, snapshots: dict[str, RepoSnapshot]) -> str:
    snap = snapshots.get(repo.role)
    if snap is None:
        return f"{repo.repo_id} (waiting for access)"
    if repo.role != "target":
        return f"{repo.repo_id}@{snap.commit[:12]}"
    text = snap.text_config()
    return (f"{repo.repo_id}@{snap.commit[:12]} ({text.get('model_type')}, {text.get('num_hidden_layers')} "
            f"layers, {_gb(snap.total_bytes)})")


@operation()
def check(deployment: Deployment, snapshots: dict[str, RepoSnapshot], hub_problems: list[str],
          access_pending: list[str]):
    """
    Refuse the host, changing nothing, unless it can serve this deployment.

    Hardware matches the class, the driver suits the pinned SGLang, the token may
    download every repo, the model fits the GPUs at the class's TP size, the disk
    has room for what is still missing, and a DDTree profile has a DDTree build.
    A gated repo whose terms the token's user has not accepted yet refuses a host
    that serves (or did); a host serving nothing yet passes, to be prepared while
    access is pending (``access_pending`` fails it after its downloads started).

    + deployment: the host's resolved deployment
    + snapshots: per role, the commit and files of each repo the token may read (from ``hub_snapshots``)
    + hub_problems: what ``hub_snapshots`` found wrong on the controller
    + access_pending: the gated repos the token may not download yet (from ``hub_snapshots``)

    **Example:**

    .. code:: python

        snapshots, hub_problems, access_pending = preflight.hub_snapshots(deployment)
        preflight.check(name="Preflight", deployment=deployment, snapshots=snapshots,
                        hub_problems=hub_problems, access_pending=access_pending)
    """
    d = deployment
    gathering.gather(gathering.requests(d, snapshots))  # what every operation reads, in one round trip
    problems = login_problems(gathering.read(LoginUser))
    problems += [f"{host.name}: {problem}" for problem in hub_problems]
    gpu_host = gathering.read(NvidiaHost)
    gpus = gpu_host["NvidiaGpus"]
    if gpus is None and d.install_driver:
        # No driver yet: the deploy lays it down; the GPUs are checked after its reboot (`gpus`).
        _release, release_problem = host_release()
        problems += packages.before_driver_problems(host.name, release_problem, host.get_fact(packages.FreshHost),
                                                    d.host_class, d.expected_gpus)
    else:
        problems += check_gpu_class(host.name, d.host_class, d.expected_gpus, gpus, gpu_host["NvidiaTopology"],
                                    gpu_host["NvidiaDriver"], gpu_host["RebootPending"],
                                    install_driver=d.install_driver)
    if snapshots:  # the repos the token may read; one waiting for access is checked on the run after
        problems += memory_problems(d, snapshots, gpus)
        disk = gathering.read(WeightsDisk, local_dirs=tuple(r.local_dir for r in d.repos))
        problems += disk_problems(d, snapshots, disk)
    problems += venv.python_problems(host.name, gathering.read(venv.HostPython, uv=venv.Uv(d.install_dir).binary))
    problems += ddtree_problems(d)
    key_file = gathering.read(FileStates, paths=(d.api_key_file,)).get(d.api_key_file)
    problems += exposure_problems(d, bool(os.environ.get(d.api_key_env)), key_file is not None)
    moving, warnings = moving_revisions(d, snapshots)
    problems += [f"{host.name}: {sentence}" for sentence in moving]
    waiting = [f"{host.name}: {problem}" for problem in access_pending]
    # A host that serves is never touched while a repo waits for access: its server keeps running as is.
    if waiting and (problems or serves(host.get_fact(ServiceState, unit_file=d.unit_file, env_file=d.env_file,
                                                     service=d.service_name))):
        problems += waiting
    if problems:
        yield fail_host(problems)
        return
    for warning in warnings:
        host.log_styled(f"{host.name}: {warning}", fg="yellow")
    if waiting:
        host.log_styled(f"{host.name}: serves nothing yet and waits for access to "
                        f"{', '.join(r.repo_id for r in d.repos if r.role not in snapshots)}: preparing "
                        "everything else and starting the downloads it may read; it fails once they are started",
                        fg="yellow")
    found = f"{len(gpus)}x {gpus[0]['name']}" if gpus else "no driver yet"
    host.noop(f"preflight passed: {found} as {d.host_class}; "
              + " with ".join(_described(repo, snapshots) for repo in d.repos))


@operation()
def access_pending(deployment: Deployment, snapshots: dict[str, RepoSnapshot], pending: list[str]):
    """
    Fail a host prepared while gated repos wait for access, naming each repo and its terms page.

    Runs after the downloads of the repos the token may read were started in their units
    (they go on after the deploy ends); the run after access is granted fetches only what
    is missing and starts serving.

    + deployment: the host's resolved deployment
    + snapshots: the repos the token may read (from ``hub_snapshots``)
    + pending: the gated repos the token may not download yet (from ``hub_snapshots``)

    **Example:**

    .. code:: python

        preflight.access_pending(name="Access to gated repos", deployment=d, snapshots=snapshots,
                                 pending=access_pending)
    """
    units = " ".join(f"{r.unit_name}.service" for r in deployment.repos if r.role in snapshots)
    started = f"the downloads it may read go on in their units ({units})" if units else "it may read no repo"
    yield fail_host([f"{host.name}: {problem}; meanwhile everything else is prepared and {started}, so that run "
                     "fetches only what is missing and starts serving" for problem in pending])


@operation()
def refuse(problem: str):
    """
    Fail this host with one sentence, changing nothing: its data cannot be deployed (a bad knob,
    an unknown profile, class or attention kind). The other hosts go on.

    + problem: the sentence: host, what is wrong, what is accepted

    **Example:**

    .. code:: python

        preflight.refuse(name="Preflight", problem="ct200: install_driver='maybe' is not a boolean: ...")
    """
    yield fail_host([problem])


@operation()
def gpus(deployment: Deployment):
    """
    Check the GPUs against the host's class once the driver the deploy installed is loaded
    (preflight could not read them without a driver).

    + deployment: the host's resolved deployment

    **Example:**

    .. code:: python

        preflight.gpus(name="GPUs as the class says", deployment=deployment)
    """
    d = deployment
    gpu_host = host.get_fact(NvidiaHost)
    problems = check_gpu_class(host.name, d.host_class, d.expected_gpus, gpu_host["NvidiaGpus"],
                               gpu_host["NvidiaTopology"], gpu_host["NvidiaDriver"], gpu_host["RebootPending"])
    if problems:
        yield fail_host(problems)
    else:
        host.noop(f"{len(gpu_host['NvidiaGpus'])}x {gpu_host['NvidiaGpus'][0]['name']} on driver "
                  f"{gpu_host['NvidiaDriver']['version']}, as {d.host_class} needs")


@operation()
def fabric(deployment: Deployment):
    """
    Check the GPU fabric after the deploy set it up: NVSwitch classes need fabric manager active
    and every GPU's fabric Completed; the PCIe class must not run fabric manager.

    + deployment: the host's resolved deployment

    **Example:**

    .. code:: python

        preflight.fabric(name="Check the GPU fabric", deployment=deployment)
    """
    problems = check_fabric(host.name, deployment.host_class, deployment.expected_gpus, gathering.read(NvidiaFabric))
    if problems:
        yield fail_host(problems)
    else:
        host.noop("GPU fabric as the class needs it")


@gathering.wants
def _read(deployment, snapshots) -> gathering.Wanted:
    d = deployment
    wanted = [(LoginUser, {}), (FileStates, dict(paths=(d.api_key_file,)))]
    if len(snapshots) == len(d.repos):
        wanted.append((WeightsDisk, dict(local_dirs=tuple(r.local_dir for r in d.repos))))
    return wanted
