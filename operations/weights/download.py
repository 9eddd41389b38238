"""Pinned, resumable, verified model weights, downloaded by a systemd unit on the host."""

import json
import posixpath
import shlex
import time
from collections.abc import Callable
from io import StringIO

from pyinfra import host
from pyinfra.api import FactBase, FunctionCommand, QuoteString, StringCommand, operation
from pyinfra.operations import files

from deployment.weights.config import Repo, Weights
from operations.basics import gathering, outcomes, polling, shell
from operations.basics.file_states import FileStates, matches
from operations.basics.host_programs import inline
from operations.basics.templates import render
from operations.weights.checks import WeightsOnDisk, revisions_read
from operations.weights.host_scripts import weights_manifest
from operations.weights.host_scripts.weights_manifest import MANIFEST
from operations.weights.hub import RepoSnapshot

# What the run's fan-out gives one repo's spec (from the hub's listing as (path, size)), or None.
Shared = Callable[[Repo], Callable[[list[tuple[str, int]]], dict] | None]
HOST_WAIT_S = 5.0  # longest a progress probe waits on the host for the downloads to end


class WeightsState(FactBase):
    """
    Per weights directory: None without a manifest (incomplete), else the manifest's commit and
    the hub-listed files whose size on disk is wrong (host_scripts/weights_state.py; in a deploy, derived
    from WeightsOnDisk).

    .. code:: python

        {"/srv/specfleet/models/moonshotai--Kimi-K2.6":
            {"commit": "3f2a...", "bad": ["model-00007-of-00064.safetensors"]},
         "/srv/specfleet/models/z-lab--Kimi-K2.6-DFlash": None}
    """

    host_answer = "weights_state.answer"
    answered_by = WeightsOnDisk

    def command(self, listings: str) -> str:
        return inline("weights_state", listings)

    @staticmethod
    def from_answer(on_disk: dict, listings: str) -> dict | None:
        sizes = json.loads(listings)
        read = revisions_read(on_disk, sizes)
        return None if read is None else {local_dir: weights_manifest.state_of(entry, sizes[local_dir])
                                          for local_dir, (entry, _) in read.items()}

    def process(self, output):
        return json.loads("\n".join(output))


class WeightsCorrupt(FactBase):
    """
    Hub-listed files whose content differs from the hub's hashes (host_scripts/verify_weights.py,
    run as the download user, who owns the files; reads every byte).

    .. code:: python

        ["model-00003-of-00064.safetensors"]
    """

    def command(self, local_dir: str, listing: str, user: str) -> str:
        return inline("verify_weights", local_dir, listing, user=user)

    def process(self, output):
        return json.loads("\n".join(output))


def state_listings(repos: list[Repo], snapshots: dict[str, RepoSnapshot]) -> str:
    """WeightsState's argument: per directory, each file the hub lists and its size (JSON, stable)."""
    return json.dumps({r.local_dir: {f.path: f.size for f in snapshots[r.role].files} for r in repos},
                      sort_keys=True)


def download_spec(repo: Repo, snap: RepoSnapshot) -> dict:
    """What the fetcher reads: the revision, where it lands, and the directory of the repo's other revisions
    (files their manifests recorded with the listing's sha256 are linked, not fetched)."""
    return {"repo_id": repo.repo_id, "commit": snap.commit, "local_dir": repo.local_dir, "revisions_dir": repo.repo_dir,
            "files": snap.listing()}


@operation()
def download(weights: Weights, snapshots: dict[str, RepoSnapshot],
             poll_interval: float = 0.1, wait: bool = True, shared: Shared | None = None):
    """
    Make the target and drafter weights complete at their pinned commits.

    Each repo is fetched by its own systemd unit on the host (so a dropped SSH
    connection does not stop it); the deploy waits with progress, and attaches to
    a download that is already running.

    + weights: the host's weights (repos, owner, hub; `verify`: hash every file against the hub's hashes
      and re-fetch those that differ)
    + snapshots: per role, the repo's commit and files as the hub lists them (from preflight)
    + poll_interval: seconds between progress checks (each is one SSH round trip, which waits on the host
      up to ``HOST_WAIT_S`` for the downloads to end)
    + wait: wait for the downloads; without, they are started and go on after the deploy
      (a host waiting for access to a gated repo is not kept waiting on the others)
    + shared: per repo, what its spec gets of the run's weights fan-out from the hub's listing, made once
      the run executes (operations/weights/sharing.py HostPart.spec_of); None for a repo taken from the hub

    **Example:**

    .. code:: python

        download.download(name="Weights", weights=deployment.weights, snapshots=hub.snapshots)
    """
    repos = [r for r in weights.repos if r.role in snapshots]  # a gated repo waiting for access has none yet
    states = gathering.read(WeightsState, listings=state_listings(repos, snapshots))
    pending: list[Repo] = []
    for repo in repos:
        snap, state = snapshots[repo.role], states.get(repo.local_dir)
        if not state or state["commit"] != snap.commit or state["bad"]:
            pending.append(repo)
            continue
        if not weights.verify:
            continue
        listed = {f.path for f in snap.files}
        corrupt = [path for path in host.get_fact(WeightsCorrupt, local_dir=repo.local_dir, user=weights.owner,
                                                  listing=json.dumps(snap.listing(), sort_keys=True))
                   if path in listed]  # names from the hub's validated listing only, never the host's
        if corrupt:
            pending.append(repo)
            # Deleted as the download user, who owns them: the download unit then fetches them again.
            yield (f"runuser -u {shlex.quote(weights.owner)} -- rm -f -- "
                   + " ".join(shlex.quote(posixpath.join(repo.local_dir, path)) for path in corrupt))

    if not pending:
        host.noop("weights complete: " + ", ".join(
            f"{r.repo_id}@{snapshots[r.role].commit[:12]} ({len(snapshots[r.role].files)} files)"
            for r in repos))
        return

    uploads = {}  # each repo's spec and unit file, by path
    fanned_out = []  # the specs with a part of the fan-out: written once the run's probes are in
    for repo in pending:
        spec_file = f"{weights.config_dir}/{repo.spec_file_name}"
        part = shared(repo) if shared else None
        if part:
            fanned_out.append(FunctionCommand(write_spec, (spec_file, download_spec(repo, snapshots[repo.role]), part),
                                              {}))
        else:
            uploads[spec_file] = json.dumps(download_spec(repo, snapshots[repo.role]), indent=1)
        uploads[f"/etc/systemd/system/{repo.unit_name}.service"] = render(
            "weights/weights.service.j2", w=weights, repo=repo, commit=snapshots[repo.role].commit, spec_file=spec_file)
    # One round trip for every path, where files.put reads two or three facts each. The repo's directory
    # is ``owned``'s; the fetcher, as its owner, makes the revision's inside it.
    states = gathering.read(FileStates, paths=tuple(uploads))
    for dest, content in uploads.items():
        if not matches(states.get(dest), "file", "644", content=content.encode()):
            yield from shell.put(src=StringIO(content), dest=dest, mode="644")
    yield from fanned_out
    units = " ".join(f"{r.unit_name}.service" for r in pending)
    # One round trip. reset-failed: a unit that used up its restarts on an earlier run may start
    # again now. `start` on a unit that is already running attaches to it instead of starting another.
    yield (f"{reload_if_changed(units)} && {{ systemctl reset-failed {units} 2>/dev/null || true; }} && "
           f"systemctl start --no-block {units}")
    if wait:
        yield FunctionCommand(wait_for_downloads, (pending, snapshots, poll_interval), {})


def write_spec(state, host, path: str, spec: dict, part: Callable[[list[tuple[str, int]]], dict]) -> bool:
    """Write a fetch spec with its part of the fan-out (root's file in root's directory, replaced whole)."""
    # The files the hub lists with a sha256 only: the others come from the hub alone (host_scripts/weights_sources.py).
    shared = [(e["path"], e["size"]) for e in spec["files"] if e.get("sha256")]
    return shell.write_readable(host, path, json.dumps({**spec, **part(shared)}, indent=1))


# The download units of earlier specfleet versions, one per role (a unit per repo took their place).
EARLIER_ROLES = ("target", "drafter")


def earlier_paths(config_dir: str) -> tuple[str, ...]:
    return (*(f"/etc/systemd/system/specfleet-weights-{role}.service" for role in EARLIER_ROLES),
            *(f"{config_dir}/weights-{role}.json" for role in EARLIER_ROLES))


@operation()
def earlier_units_removed(weights: Weights):
    """
    Remove the download units of earlier specfleet versions (one per role, `specfleet-weights-target`)
    and their specs: a unit per repo took their place, and theirs would download into the single
    directory those versions used.

    + weights: the host's weights (its configuration directory)

    **Example:**

    .. code:: python

        download.earlier_units_removed(name="Earlier download units", weights=deployment.weights)
    """
    paths = earlier_paths(weights.config_dir)
    present = [p for p, state in (gathering.read(FileStates, paths=paths) or {}).items() if state]
    if not present:
        host.noop("no download unit of an earlier specfleet version")
        return
    units = [p.rsplit("/", 1)[1] for p in present if p.endswith(".service")]
    if units:
        yield f"systemctl stop {' '.join(units)} 2>/dev/null || true"
    # Root's own files in root's directories.
    yield "rm -f -- " + " ".join(shlex.quote(p) for p in present)
    yield "systemctl daemon-reload"


WEIGHTS_MODE = "750"  # a repo's directory: its owner writes, the service group reads (g=rX), others nothing


def owned_as_wanted(state: dict | None, weights: Weights) -> bool:
    """Whether a FileStates entry is a repo directory as ``owned`` makes it."""
    return matches(state, "directory", WEIGHTS_MODE) and \
        (state["user"], state["group"]) == (weights.owner, weights.reader)


@operation()
def owned(weights: Weights):
    """
    Each repo's directory (its revisions inside) owned by the download user, group the service user,
    which reads the weights (directories 0750, files 0640) and writes none of them. A repo an earlier
    deployment gave the service user is re-owned, its whole tree: the download user's from then on.

    + weights: the host's weights (their repos, owner and reader)

    **Example:**

    .. code:: python

        download.owned(name="Weights owned by the download user", weights=deployment.weights)
    """
    states = gathering.read(FileStates, paths=tuple(r.repo_dir for r in weights.repos))
    wrong = [r.repo_dir for r in weights.repos if not owned_as_wanted(states.get(r.repo_dir), weights)]
    if not wrong:
        host.noop(f"the weights are {weights.owner}'s, read by the group {weights.reader}")
    for path in wrong:
        if not states.get(path):
            yield from files.directory._inner(path=path, user=weights.owner, group=weights.reader, mode=WEIGHTS_MODE)
            continue
        # chown first, not following links (-R's default, -P): from then on the service user, which may have
        # planted one, can change nothing in the tree that chmod then walks (which ignores links inside it).
        yield StringCommand("chown", "-R", "--no-dereference", f"{weights.owner}:{weights.reader}", QuoteString(path))
        yield StringCommand("chmod", "-R", "u=rwX,g=rX,o=", QuoteString(path))


def reload_if_changed(units: str) -> str:
    """`systemctl daemon-reload`, on the host only if one of UNITS needs it (a reload costs ~0.5 s).

    Only a unit systemd holds in memory (running, failed) whose file changed since needs it; one it
    does not hold is read from its file when asked about or started."""
    return (f"if systemctl show -p LoadState,NeedDaemonReload --value {units} | grep -qvx -e loaded -e no -e ''; "
            "then systemctl daemon-reload; fi")


class Rate:
    """Bytes per second over the last `window_s` of (elapsed, bytes done) samples."""

    def __init__(self, window_s: float = 30.0):
        self.window_s, self.samples = window_s, []

    def add(self, elapsed: float, done: int) -> None:
        self.samples.append((elapsed, done))
        while len(self.samples) > 2 and elapsed - self.samples[1][0] >= self.window_s:
            self.samples.pop(0)

    def bytes_per_s(self) -> float | None:
        (t0, b0), (t1, b1) = self.samples[0], self.samples[-1]
        return (b1 - b0) / (t1 - t0) if t1 - t0 >= 1 else None


def duration(seconds: float) -> str:
    """A time left as people read it: 45 s, 12 min, 3 h 20 min."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds // 3600:.0f} h {seconds % 3600 / 60:.0f} min"


def progress(done: int, total: int, bytes_per_s: float | None) -> str:
    """One progress line: bytes done of total, the rate, the time left at that rate."""
    line = f"weights: {done / 1e9:.2f} / {total / 1e9:.2f} GB ({min(done / max(total, 1), 1):.0%})"
    if bytes_per_s is None:
        return line
    if bytes_per_s <= 0:
        return f"{line}, no bytes in the last {Rate().window_s:.0f} s"
    return f"{line}, {bytes_per_s / 1e6:.0f} MB/s, {duration(max(total - done, 0) / bytes_per_s)} left"


def wait_for_downloads(state, host, repos: list[Repo], snapshots: dict[str, RepoSnapshot],
                       poll_interval: float, start_grace_s: float = 30.0) -> bool:
    """Poll the download units, logging bytes done / total, the rate and the time left, until each repo's
    manifest is written.

    A unit that looks finished while its manifest is missing has not begun the
    start job queued by ``systemctl start --no-block`` (or was stopped): it is
    waited for up to ``start_grace_s``, then reported as failed.
    """
    total = sum(snapshots[r.role].total_bytes for r in repos)
    dirs = " ".join(shlex.quote(r.local_dir) for r in repos)
    units = " ".join(f"{r.unit_name}.service" for r in repos)
    # Each probe first waits on the host (up to HOST_WAIT_S) while a fetcher process lives, so the
    # end of a download is seen within 0.1 s, not a poll interval and a round trip later. It looks
    # at /proc, not systemctl, which would cost the host ~7 ms of CPU per look.
    wait = (f"pids=$(systemctl show -p MainPID --value {units}); for _ in $(seq {int(HOST_WAIT_S * 10)}); do "
            'busy=; for p in $pids; do [ "$p" != 0 ] && [ -d /proc/$p ] && busy=1; done; '
            '[ -n "$busy" ] || break; sleep 0.1; done; ')
    probe = wait + "; ".join(
        f"echo $(systemctl is-active {r.unit_name}) $(systemctl show -p Result --value {r.unit_name}) "
        f"$(test -f {shlex.quote(r.local_dir)}/{MANIFEST} && echo complete || echo missing)"
        for r in repos) + f"; du -sbc {dirs} 2>/dev/null | tail -1 | cut -f1"
    unit_states: list[list[str]] = []
    rate = Rate()
    started = time.monotonic()

    def check(elapsed: float):
        ok, output = shell.run(host, probe)
        lines = output.stdout_lines
        if len(lines) != len(repos) + 1:
            return False, ""
        unit_states[:] = [line.split() for line in lines[:-1]]
        done = int(lines[-1] or 0)
        rate.add(elapsed, done)
        running = any(active in ("activating", "active", "reloading") for active, *_ in unit_states)
        not_begun = any(result == "success" and manifest == "missing" for _, result, manifest in unit_states)
        if not running and not (not_begun and elapsed < start_grace_s):
            return True, ""
        return None, progress(done, total, rate.bytes_per_s())

    if not polling.wait(host, check, interval_s=poll_interval, log_every_s=10):
        return False
    failed = [r for r, (_, result, manifest) in zip(repos, unit_states)
              if result != "success" or manifest != "complete"]
    for repo in failed:
        _, journal = shell.run(host, f"journalctl -u {repo.unit_name}.service -n 15 --no-pager -o cat")
        host.log_styled(f"weights download of {repo.repo_id} failed; its journal:\n{journal.stdout}",
                        fg="red")
    if not failed:
        host.log(f"weights: {total / 1e9:.2f} GB complete")
        note_received(host, repos, time.monotonic() - started)
    return not failed


def note_received(host, repos: list[Repo], seconds: float) -> None:
    """The bytes the fetchers took from the hub and from peers (their manifests' `received`) and how long the
    downloads took, added to the host's notes for the run's table."""
    # Read as the weights' state is (weights_manifest.read): the manifests are in the download user's directories.
    _, output = shell.run(host, inline("weights_received", *(r.local_dir for r in repos)))
    noted = outcomes.noted(host.state).get(host.name, {}).get("weights_received", {})
    received = {"hub": noted.get("hub", 0), "peers": noted.get("peers", 0),
                "seconds": noted.get("seconds", 0.0) + seconds}
    try:
        found = json.loads("\n".join(output.stdout_lines))
    except ValueError:
        found = {}
    for counts in (found.values() if isinstance(found, dict) else ()):
        for source in ("hub", "peers"):
            if isinstance(counts, dict) and isinstance(counts.get(source), int):
                received[source] += counts[source]
    outcomes.note(host, weights_received=received)


@gathering.wants
def _read(deployment) -> gathering.Wanted:
    repos = deployment.weights.repos
    return [(FileStates, dict(paths=earlier_paths(deployment.weights.config_dir))),
            (FileStates, dict(paths=tuple(r.repo_dir for r in repos))),
            (WeightsOnDisk, dict(repo_dirs=tuple(r.repo_dir for r in repos)))]
