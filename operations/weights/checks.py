"""What must hold before the weights are fetched: the hub answers, the token may read every repo (or a
gated one waits for its terms), revisions are commits, the disk has room; each failure one sentence."""

import json
import posixpath
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from pyinfra import host
from pyinfra.api import FactBase, operation

from deployment.knobs import COMMIT
from deployment.weights.config import Repo, Weights
from operations.basics import gathering
from operations.basics.failing import fail_host
from operations.basics.host_programs import inline
from operations.basics.untrusted import printable
from operations.weights.host_scripts import weights_manifest
from operations.weights.hub import (AccessPending, HubProblem, RepoSnapshot, controller_token, hub_outages, hub_url,
                                   repo_snapshot, whoami)


@dataclass(frozen=True)
class HubState:
    """What the hub said of a host's repos, on the controller, before any host is touched."""

    snapshots: dict[str, RepoSnapshot]  # per role: the repos the token may read, at their commits
    problems: list[str]  # what stops the host before any change
    pending: list[str]  # gated repos whose terms the token's user has not accepted yet

    @property
    def complete(self) -> bool:
        """Every repo was read: nothing waits for access, nothing failed."""
        return not self.problems and not self.pending

    @property
    def commits(self) -> dict[str, str]:
        return {role: snap.commit for role, snap in self.snapshots.items()}

    @property
    def total_bytes(self) -> int:
        return sum(snap.total_bytes for snap in self.snapshots.values())

    @property
    def weight_bytes(self) -> int:
        return sum(snap.weight_bytes for snap in self.snapshots.values())


def hub_state(weights: Weights) -> HubState:
    """On the controller: the token works and may download every repo; each repo's commit and files.
    A gated repo waiting for its terms is `pending`, apart from the problems: a host serving nothing
    yet is prepared meanwhile (``access_pending`` fails it once its downloads started)."""
    w = weights
    try:
        endpoint = hub_url(w.hf_endpoint)
    except HubProblem as problem:  # the controller's HF_ENDPOINT: no hub is asked
        return HubState({}, [str(problem)], [])
    token = controller_token(w.hf_token_env)

    def one(repo: Repo):
        try:
            return repo_snapshot(w.hf_endpoint, token, repo.repo_id, repo.revision)
        except AccessPending as waiting:  # before HubProblem, which it is
            return waiting
        except HubProblem as problem:
            return str(problem)
        except hub_outages() as error:
            return outage(f"{endpoint}/{repo.repo_id}", error)

    snapshots, problems, pending = {}, [], []
    # The token's check and the repos' hub calls at once: the run waits for the slowest answer, not for
    # their sum (the lab hub's whoami took 0.06 s, a repo's info and config 0.07-0.14 s). The repos'
    # answers count only once the hub knows the token; without a token no repo is asked.
    with ThreadPoolExecutor(max_workers=len(w.repos) + 1) as pool:
        token_checked = pool.submit(token_problem, w.hf_endpoint, token)
        outcomes = pool.map(one, w.repos) if token else iter(())
        problem = token_checked.result()
        if problem:
            return HubState({}, [problem], [])
        for repo, outcome in zip(w.repos, outcomes):
            if isinstance(outcome, RepoSnapshot):
                snapshots[repo.role] = outcome
            elif isinstance(outcome, AccessPending):
                pending.append(str(outcome))
            else:
                problems.append(outcome)
    return HubState(snapshots, problems, pending)


def token_problem(endpoint: str | None, token: str | None) -> str:
    """What stops the controller's token at the hub (none, invalid, the hub unreachable), in one sentence; ""
    when the hub knows the token's user."""
    try:
        whoami(endpoint, token)
    except HubProblem as problem:
        return str(problem)
    except hub_outages() as error:
        return outage(hub_url(endpoint), error)
    return ""


def outage(where: str, error: Exception) -> str:
    cause = printable(" ".join(str(error).split())[:200]) or type(error).__name__
    return (f"the hub at {where} did not answer as a hub does ({type(error).__name__}: {cause}): check the "
            "network and hf_endpoint, then re-run (nothing was changed)")


def gb(size: int) -> str:
    return f"{size / 1e9:.1f} GB ({size} bytes)"


class WeightsOnDisk(FactBase):
    """
    Per repo directory: its revision directories as they are on disk (host_scripts/weights_on_disk.py), what
    WeightsDisk and WeightsState are derived from on the controller. It names no commit and no listing, so
    the deploy reads it while the hub answers.

    .. code:: python

        {"/srv/specfleet/models/moonshotai--Kimi-K2.6":
            {"here": {"checked": "/srv/specfleet/models/moonshotai--Kimi-K2.6", "free": 636707266560, "device": 2049},
             "entries": {"/srv/specfleet/models/moonshotai--Kimi-K2.6/3f2a...": {"dir": True, "manifest": {...},
                         "files": {"config.json": [3512, True]}, "checked": "...", "free": 636707266560,
                         "device": 2049}},
             "legacy": None}}
    """

    host_answer = "weights_on_disk.answer"

    def command(self, repo_dirs: tuple[str, ...]) -> str:
        return inline("weights_on_disk", *repo_dirs)

    def process(self, output):
        return json.loads("\n".join(output))


def revisions_read(on_disk: dict, local_dirs) -> dict[str, tuple[dict, list[dict]]] | None:
    """Each revision directory as WeightsOnDisk read it, with its repo's other revisions; None where that
    answer does not hold one of them (another repo's, or a directory not named by a commit)."""
    repos = {local_dir: on_disk.get(posixpath.dirname(local_dir)) for local_dir in local_dirs}
    if any(repo is None or not COMMIT.fullmatch(posixpath.basename(local_dir)) for local_dir, repo in repos.items()):
        return None
    return {local_dir: (weights_manifest.revision(repo, local_dir), weights_manifest.revisions_besides(local_dir, repo))
            for local_dir, repo in repos.items()}


class WeightsDisk(FactBase):
    """
    Per weights directory: free bytes on its filesystem, the filesystem's device, and files present
    (host_scripts/weights_disk.py; in a deploy, derived from WeightsOnDisk).

    .. code:: python

        {"/srv/specfleet/models/moonshotai--Kimi-K2.6":
            {"free": 636707266560, "device": 2049, "checked": "/srv", "files": {"config.json": 3512}}}
    """

    host_answer = "weights_disk.answer"
    answered_by = WeightsOnDisk

    def command(self, local_dirs: tuple[str, ...]) -> str:
        return inline("weights_disk", *local_dirs)

    @staticmethod
    def from_answer(on_disk: dict, local_dirs: tuple[str, ...]) -> dict | None:
        read = revisions_read(on_disk, local_dirs)
        return None if read is None else {local_dir: weights_manifest.disk_of(*found) for local_dir, found in read.items()}

    def process(self, output):
        return json.loads("\n".join(output))


def disk_problems(wanted: list[tuple[Weights, dict[str, RepoSnapshot]]], disk: dict) -> list[str]:
    """Bytes still missing per filesystem (plus one shard of headroom for a partial file) against free bytes,
    over every deployment's weights (`wanted`: each one's weights and snapshots; a repo two share counts once)."""
    repos = {r.local_dir: (r, snapshots[r.role]) for weights, snapshots in wanted for r in weights.repos
             if r.role in snapshots}  # a repo waiting for access: next run
    unknown = [local_dir for local_dir in repos if not (disk or {}).get(local_dir)]
    if unknown:
        return [f"{host.name}: the host did not say how much room {', '.join(unknown)} has (its disk check "
                "printed nothing; it needs python3 on the host): install python3, then re-run"]
    linked = [local_dir for local_dir in repos if disk[local_dir].get("linked")]
    if linked:
        return [f"{host.name}: {local_dir} is a link, not the revision directory the deploy makes (the service "
                "user owns the directory holding it): remove the link, then re-run (the fetch makes the "
                "directory again)" for local_dir in linked]
    needs: dict[int, list] = {}
    for local_dir, (repo, snap) in repos.items():
        on_disk = disk[local_dir]
        # A file another revision holds is linked into this one: it costs no room.
        elsewhere = set(on_disk.get("others") or ())
        missing = [f.size for f in snap.files if on_disk["files"].get(f.path) != f.size
                   and held(f) not in elsewhere]
        need = needs.setdefault(on_disk["device"], [0, 0, on_disk["free"], on_disk["checked"], []])
        need[0] += sum(missing)
        need[1] = max([need[1], *missing])
        need[4].append(local_dir)
    return [
        f"{host.name}: the weights need {gb(missing)} more in {', '.join(dirs)} (+ {gb(headroom)} headroom "
        f"for a partial file), but the filesystem holding {checked} has {gb(free)} free: free space there "
        "or point weights_dir at a larger disk"
        for missing, headroom, free, checked, dirs in needs.values()
        if missing and missing + headroom > free
    ]


def held(file) -> str:
    """A listed file's content as weights_disk.py names what other revisions hold."""
    return f"sha256:{file.sha256}:{file.size}" if file.sha256 else f"git_sha1:{file.git_sha1}:{file.size}"


def disk_state(weights: Weights) -> dict:
    return gathering.read(WeightsDisk, local_dirs=tuple(r.local_dir for r in weights.repos))


def unpinned(weights: Weights, snapshots: dict[str, RepoSnapshot], profile_name: str) -> list[str]:
    """A sentence per repo whose revision is a branch or tag: its weights follow whatever it points at."""
    return [f"{repo.repo_id}: revision {repo.revision!r} is not a commit; it resolves to "
            f"{snapshots[repo.role].commit} now: pin it with `python pin.py INVENTORY` (it writes the commits of "
            f"profile {profile_name} to SPECFLEET_SITE/pins.json) for reproducible weights, or set "
            "allow_branch_revisions=true to follow the branch"
            for repo in weights.repos if repo.role in snapshots and not COMMIT.fullmatch(repo.revision)]


def described(weights: Weights, snapshots: dict[str, RepoSnapshot]) -> str:
    """The repos as preflight found them: target (model type, layers, size) with drafter."""
    found = []
    for repo in weights.repos:
        snap = snapshots.get(repo.role)
        if snap is None:
            found.append(f"{repo.repo_id} (waiting for access)")
        elif repo.role != "target":
            found.append(f"{repo.repo_id}@{snap.commit[:12]}")
        else:
            text = snap.text_config()
            found.append(f"{repo.repo_id}@{snap.commit[:12]} ({printable(text.get('model_type'))}, "
                         f"{printable(text.get('num_hidden_layers'))} layers, {gb(snap.total_bytes)})")
    return " with ".join(found)


@operation()
def access_pending(weights: Weights, hub: HubState):
    """
    Fail a host prepared while gated repos wait for access, naming each repo and its terms page.

    Runs after the downloads of the repos the token may read were started in their units
    (they go on after the deploy ends); the run after access is granted fetches only what
    is missing and starts serving.

    + weights: the host's weights
    + hub: what the hub said of them (``hub_state``)

    **Example:**

    .. code:: python

        checks.access_pending(name="Access to gated repos", weights=d.weights, hub=hub)
    """
    units = " ".join(f"{r.unit_name}.service" for r in weights.repos if r.role in hub.snapshots)
    started = f"the downloads it may read go on in their units ({units})" if units else "it may read no repo"
    yield fail_host([f"{host.name}: {problem}; meanwhile everything else is prepared and {started}, so that run "
                     "fetches only what is missing and starts serving" for problem in hub.pending],
                    static=True)  # the hub's answer, on the controller


@gathering.wants
def _read(deployment) -> gathering.Wanted:
    return [(WeightsOnDisk, dict(repo_dirs=tuple(r.repo_dir for r in deployment.weights.repos)))]
