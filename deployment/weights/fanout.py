"""The weights' fan-out: which host of a run takes each file of a revision from whom.

The hosts of one run that deploy the same revision of a repo (the same repo at the same commit,
`weights_fanout` on) are its holders. Each file is fetched from the hub by one of them, its seed
(the seeds chosen so that each holder takes about an equal share of the bytes from the hub), and
reaches the others in rounds that double its sources, as a binomial tree: in round r the 2^(r-1)
holders that have it each serve one more. N holders have every file after ceil(log2 N) transfer
times, and the hub serves each byte once per run.

A holder's sources for a file are its parent in that tree, then the parent's ancestors (each had it
before), then the hub: the fetcher (host_scripts/fetch_weights.py) drops a peer that serves a wrong
byte or cannot be reached and goes on to the next. A host that preflight found cannot reach a peer on
the fan-out port (`cut_off`) takes part in nothing: it takes every file from the hub, and no peer
counts on it. The plan is a function of the run's fleet alone (inventory order, the hub's listing),
so each host's deploy computes the same one.
"""

import posixpath
from collections.abc import Iterable
from dataclasses import dataclass

from deployment import network
from deployment.weights.config import Weights

HUB = "hub"  # the last source of every file: the hub (or the site's mirror, hf_endpoint)


@dataclass(frozen=True)
class Holder:
    """A host of the run that deploys a revision and takes part in its fan-out."""

    name: str  # the inventory host
    address: str  # where its peers reach it (network.inventory_address)
    port: int  # its peer server's (`weights_fanout_port`)


@dataclass(frozen=True)
class Take:
    """How one host takes one file: in which round it has it (0: its seed, from the hub), and its sources."""

    round: int
    sources: tuple[str, ...]  # peers by name, then HUB


@dataclass(frozen=True)
class Revision:
    """A repo at a commit, as the hosts holding it share it."""

    repo_id: str
    commit: str
    path: str  # the revision's directory under a weights directory, `<owner>--<name>/<commit>`, on every host


def holders(hosts: Iterable[tuple[str, str, tuple[Weights, ...]]]) -> dict[Revision, tuple[Holder, ...]]:
    """The run's revisions held by two or more hosts and their holders, in inventory order.

    `hosts`: each worker host of the run as (name, address, its deployments' weights), from the fleet
    resolved once per run (deployment/gateway/membership.py WorkerHost). A revision named by a branch
    the hub has not resolved yet, a host with `weights_fanout` off, and one whose inventory address is no IP
    address, take no part: the peer servers' allow lists take addresses, and a name resolved on the controller
    would let whoever answers its DNS query into every host's list."""
    found: dict[Revision, list[Holder]] = {}
    for name, address, weights in hosts:
        if not network.is_ip(address):
            continue
        for w in weights:
            if not w.fanout:
                continue
            for repo in w.repos:
                if repo.commit is None:
                    continue
                revision = Revision(repo.repo_id, repo.commit, posixpath.join(posixpath.basename(repo.repo_dir),
                                                                              repo.commit))
                holders_of = found.setdefault(revision, [])
                if all(h.name != name for h in holders_of):
                    holders_of.append(Holder(name, address, w.fanout_port))
    return {revision: tuple(found_) for revision, found_ in found.items() if len(found_) >= 2}


def parent(position: int) -> int:
    """The position in a file's tree (its seed first) of the holder that serves the holder at `position` >= 1:
    in round r (positions 2^(r-1) .. 2^r - 1) each of the first 2^(r-1) serves one."""
    return position - (1 << (position.bit_length() - 1))


def seeds(names: tuple[str, ...], files: Iterable[tuple[str, int]]) -> dict[str, str]:
    """Per file, the holder that takes it from the hub: the largest files first, each to the holder with the
    fewest bytes from the hub so far (the first in order at a tie)."""
    hub_bytes = dict.fromkeys(names, 0)
    chosen = {}
    for path, size in sorted(files, key=lambda f: (-f[1], f[0])):
        seed = min(names, key=lambda n: (hub_bytes[n], names.index(n)))
        hub_bytes[seed] += size
        chosen[path] = seed
    return chosen


def plan(names: tuple[str, ...], files: Iterable[tuple[str, int]],
         cut_off: Iterable[str] = (), complete: Iterable[str] = ()) -> dict[str, dict[str, Take]]:
    """Per host, per file, how it takes it: its round and its sources in order (peers by name, then HUB).
    A host fetching its files round by round waits on a peer only for a file that peer takes in an
    earlier round, so no two hosts wait on each other.

    `names`: a revision's holders in inventory order (``holders``); `files`: the hub's listing of it as
    (path, size); `cut_off`: the holders that do not reach the others on the fan-out port (``cut_off``);
    `complete`: the holders that have the revision already, the seeds of every file where one takes part (the
    hub then serves nothing)."""
    files = list(files)
    excluded = set(cut_off)
    taking_part = tuple(n for n in names if n not in excluded)
    sources: dict[str, dict[str, Take]] = {n: {} for n in names}
    for name in names:
        if name in excluded or len(taking_part) < 2:
            sources[name] = {path: Take(0, (HUB,)) for path, _ in files}
    if len(taking_part) < 2:
        return sources
    holding = tuple(n for n in taking_part if n in set(complete))
    for path, seed in seeds(holding or taking_part, files).items():
        start = taking_part.index(seed)
        tree = taking_part[start:] + taking_part[:start]  # the seed first, then the others in order
        for position, name in enumerate(tree):
            chain, at = [], position
            while at:
                at = parent(at)
                chain.append(tree[at])
            sources[name][path] = Take(position.bit_length(), (*chain, HUB))
    return sources


def rounds(holders_count: int) -> int:
    """The rounds from peers after a file's seed has it from the hub, for that many holders: ceil(log2 N)."""
    return (holders_count - 1).bit_length()


def peer_url(holder: Holder, revision: Revision) -> str:
    """Where `holder`'s peer server serves `revision`'s files (operations/weights/peer.py)."""
    return f"{network.url(holder.address, holder.port)}/{revision.path}"


def fetch_spec(revision: Revision, holders_of: tuple[Holder, ...], takes: dict[str, Take]) -> dict:
    """What one host's fetcher reads of the fan-out (host_scripts/weights_sources.py), beside its download
    spec: the peers it may ask and their servers' URLs of the revision, each file's peers in order and round.
    `takes`: the host's part of ``plan``."""
    asked = {name for take in takes.values() for name in take.sources if name != HUB}
    return {"peers": {h.name: peer_url(h, revision) for h in holders_of if h.name in asked},
            "sources": {path: [n for n in take.sources if n != HUB] for path, take in takes.items()
                        if take.sources != (HUB,)},
            "rounds": {path: take.round for path, take in takes.items()}}


def cut_off(names: tuple[str, ...], reached: dict[str, frozenset[str]]) -> tuple[str, ...]:
    """The holders left to the hub: those not in the largest set found whose members all reach each other on
    the fan-out port (`reached`: whom each holder's probe reached; a holder that did not probe reaches no one).
    Taken greedily, the holders reaching the most first (inventory order at a tie), so one host cut off from
    the others is the one left out, not the others from it."""
    def mutual(one: str, other: str) -> bool:
        return other in reached.get(one, ()) and one in reached.get(other, ())

    kept: list[str] = []
    for name in sorted(names, key=lambda n: (-sum(mutual(n, o) for o in names if o != n), names.index(n))):
        if name in reached and all(mutual(name, k) for k in kept):
            kept.append(name)
    return tuple(n for n in names if n not in kept)


def cut_off_line(name: str, unreached: Iterable[str], port: int) -> str:
    """The one line said of a holder left to the hub."""
    return (f"{name} and {', '.join(unreached)} do not reach each other on port {port} (weights_fanout_port): "
            f"{name} takes its weights from the hub")
