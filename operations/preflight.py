"""Preflight: everything that must hold before a host is changed, each failure naming host, cause and fix."""

import json
import os
import re
import shlex

import httpx2
from huggingface_hub.errors import HfHubHTTPError
from pyinfra import host
from pyinfra.api import FactBase, operation

from operations.deployment import COMMIT, Deployment
from operations.failure import fail_host
from operations.filestate import FileStates
from operations.gpu.checks import check_fabric, check_gpu_class
from operations.gpu.facts import NvidiaFabric, NvidiaHost
from operations.hub import HubProblem, RepoSnapshot, controller_token, snapshot, whoami
from operations.sglang import SGLangRejects, server_args
from operations.venv import VenvRequirement, fingerprint

GIB = 1 << 30
# A release pin; DDTree (open PR #29907) is in no SGLang release up to 0.5.23.
RELEASE_PIN = re.compile(r"^sglang\s*(==|~=|>=|<=|<|>|===)")
DDTREE_BUILD = "sglang @ git+https://github.com/sgl-project/sglang@COMMIT#subdirectory=python"
GIT_REVISION = re.compile(r"git\+\S+?@([^#\s]+)")  # the ref after @ in 'name @ git+URL@REF#...'
# What the hub answers when it is down or broken: no connection, a timeout, a 5xx.
HUB_OUTAGES = (httpx2.HTTPError, HfHubHTTPError, OSError)

# Free space of the filesystem that will hold each weights directory (its nearest
# existing ancestor), and the sizes of the files already there: what is missing
# is computed on the controller against the hub's file list.
_DISK_SCRIPT = """
import json, os, sys
result = {}
for d in sys.argv[1:]:
    probe = d
    while not os.path.exists(probe):
        probe = os.path.dirname(probe)
    st = os.statvfs(probe)
    files = {}
    for root, dirs, names in os.walk(d):
        dirs[:] = [x for x in dirs if x != ".cache"]
        for name in names:
            full = os.path.join(root, name)
            files[os.path.relpath(full, d)] = os.path.getsize(full)
    result[d] = {"free": st.f_bavail * st.f_frsize, "device": os.stat(probe).st_dev,
                 "checked": probe, "files": files}
print(json.dumps(result))
"""


class WeightsDisk(FactBase):
    """
    Per weights directory: free bytes on its filesystem, the filesystem's device, and files present.

    .. code:: python

        {"/srv/specfleet/models/moonshotai--Kimi-K2.6":
            {"free": 636707266560, "device": 2049, "checked": "/srv", "files": {"config.json": 3512}}}
    """

    def command(self, local_dirs: tuple[str, ...]) -> str:
        return f"python3 -c {shlex.quote(_DISK_SCRIPT)} {' '.join(map(shlex.quote, local_dirs))}"

    def process(self, output):
        return json.loads("\n".join(output))


class LoginUser(FactBase):
    """
    The user the SSH session logged in as, and whether the deploy's commands run through sudo.

    .. code:: python

        {"user": "deployer", "sudo": True}
    """

    def command(self) -> str:
        return 'echo "${SUDO_USER:-$(id -un)} ${SUDO_USER:+sudo}"'

    def process(self, output):
        user, _, sudo = output[0].partition(" ")
        return {"user": user, "sudo": sudo == "sudo"}


def login_problems(login: dict) -> list[str]:
    """The deploy logs in as root: its progress polls, readiness probe, journal reads and rollback run
    on the SSH session itself, where pyinfra's --sudo does not reach, so another user would fail halfway."""
    if login["user"] == "root" and not login["sudo"]:
        return []
    how = f"{login['user']} through sudo" if login["sudo"] else login["user"]
    return [f"{host.name}: the deploy logged in as {how}, but it must log in as root (its readiness checks, "
            "journal reads and rollback run outside sudo): connect as root (`User root` in your SSH config, "
            "or SPECFLEET_SSH_USER=root) with a key only you hold"]


def hub_snapshots(deployment: Deployment) -> tuple[dict[str, RepoSnapshot], list[str]]:
    """On the controller: the token works and may download every repo; each repo's commit and files."""
    d = deployment
    endpoint = d.hf_endpoint or "https://huggingface.co"
    token = controller_token(d.hf_token_env)
    try:
        whoami(d.hf_endpoint, token)
    except HubProblem as problem:
        return {}, [str(problem)]
    except HUB_OUTAGES as error:
        return {}, [_outage(endpoint, error)]
    snapshots, problems = {}, []
    for repo in d.repos:
        try:
            snapshots[repo.role] = snapshot(d.hf_endpoint, token, repo.repo_id, repo.revision)
        except HubProblem as problem:
            problems.append(str(problem))
        except HUB_OUTAGES as error:
            problems.append(_outage(f"{endpoint}/{repo.repo_id}", error))
    return snapshots, problems


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
    needs: dict[int, list] = {}
    for repo in deployment.repos:
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
    installed = host.get_fact(VenvRequirement, path=d.venv, distribution="sglang")
    if installed["fingerprint"] != fingerprint(d.sglang_requirement, d.pip_index_url):
        return []  # not installed yet: the unit's validation checks it before any restart
    rejected = host.get_fact(SGLangRejects, venv=d.venv, args=tuple(server_args(d)))
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


@operation()
def check(deployment: Deployment, snapshots: dict[str, RepoSnapshot], hub_problems: list[str]):
    """
    Refuse the host, changing nothing, unless it can serve this deployment.

    Hardware matches the class, the driver suits the pinned SGLang, the token may
    download every repo, the model fits the GPUs at the class's TP size, the disk
    has room for what is still missing, and a DDTree profile has a DDTree build.

    + deployment: the host's resolved deployment
    + snapshots: per role, each repo's commit and files (from ``hub_snapshots``)
    + hub_problems: what ``hub_snapshots`` found wrong on the controller

    **Example:**

    .. code:: python

        snapshots, hub_problems = preflight.hub_snapshots(deployment)
        preflight.check(name="Preflight", deployment=deployment, snapshots=snapshots,
                        hub_problems=hub_problems)
    """
    d = deployment
    problems = login_problems(host.get_fact(LoginUser))
    problems += [f"{host.name}: {problem}" for problem in hub_problems]
    gpu_host = host.get_fact(NvidiaHost)  # one round trip for GPUs, topology, driver, reboot
    gpus = gpu_host["NvidiaGpus"]
    problems += check_gpu_class(host.name, d.host_class, d.expected_gpus, gpus, gpu_host["NvidiaTopology"],
                                gpu_host["NvidiaDriver"], gpu_host["RebootPending"],
                                install_driver=d.install_driver)
    if len(snapshots) == len(d.repos):
        problems += memory_problems(d, snapshots, gpus)
        disk = host.get_fact(WeightsDisk, local_dirs=tuple(r.local_dir for r in d.repos))
        problems += disk_problems(d, snapshots, disk)
    problems += ddtree_problems(d)
    key_file = host.get_fact(FileStates, paths=(d.api_key_file,))[d.api_key_file]
    problems += exposure_problems(d, bool(os.environ.get(d.api_key_env)), key_file is not None)
    branches = [f"{host.name}: {sentence}" for sentence in [*unpinned(d, snapshots), *unpinned_builds(d)]]
    if not d.allow_branch_revisions:
        problems += branches
    if problems:
        yield fail_host(problems)
        return
    for warning in branches:
        host.log_styled(warning, fg="yellow")
    text = snapshots["target"].text_config()
    host.noop(f"preflight passed: {len(gpus)}x {gpus[0]['name']} as {d.host_class}; "
              f"{d.target.repo_id}@{snapshots['target'].commit[:12]} ({text.get('model_type')}, "
              f"{text.get('num_hidden_layers')} layers, {_gb(snapshots['target'].total_bytes)}) with "
              f"{d.drafter.repo_id}@{snapshots['drafter'].commit[:12]}")


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
def fabric(deployment: Deployment):
    """
    Check the GPU fabric after the deploy set it up: NVSwitch classes need fabric manager active
    and every GPU's fabric Completed; the PCIe class must not run fabric manager.

    + deployment: the host's resolved deployment

    **Example:**

    .. code:: python

        preflight.fabric(name="Check the GPU fabric", deployment=deployment)
    """
    problems = check_fabric(host.name, deployment.host_class, deployment.expected_gpus, host.get_fact(NvidiaFabric))
    if problems:
        yield fail_host(problems)
    else:
        host.noop("GPU fabric as the class needs it")
