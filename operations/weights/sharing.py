"""The run's weights fan-out as the deploy carries it out: the plan is deployment/weights/fanout.py's, the peer
server peer.py's.

Resolved once per run (`of`), on the first host that asks: the revisions two or more hosts of the run
hold (fanout.holders, over the fleet that deployment/gateway/membership.py resolved) while at least one of them still
lacks it (its manifest's commit, read on every holder at once, one command each); each holder at its inventory
address, which must be an IP address (nginx's allow list takes addresses; a name is never resolved here). A run whose
holders all hold their revisions starts no peer server and reads nothing more.

While the run executes, every holder probes its peers' servers on the fan-out port (`reachable`,
before any download): a peer counts as reached when its server answers the run's nonce, which only
the nginx this run configured serves, not when something accepts a connection on the port (a process
that took it while no peer server ran). Each host's fetch spec is then made from the plan with the
holders that do not reach the others left to the hub (fanout.cut_off), said in one line per such host.
pyinfra runs each operation on every host before the next, so every probe is in before the first spec
is written.
"""

import json
import posixpath
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import gevent
from pyinfra import host
from pyinfra.api import FunctionCommand, operation

from deployment import network
from deployment.weights import fanout
from deployment.weights.config import Repo, Weights
from deployment.weights.fanout import Holder, Revision
from operations.basics import shell
from operations.basics.host_programs import inline
from operations.weights import peer
from operations.weights.download import WeightsState

REACH_S = 5  # a peer's server started in the operation before: one that does not answer by then is not coming


@dataclass
class RunFanout:
    """The run's revisions to share and what the probes found (filled while the run executes)."""

    shared: dict[Revision, tuple[Holder, ...]]  # each with a holder still lacking it
    complete: dict[Revision, frozenset[str]] = field(default_factory=dict)  # its holders that have it already
    reached: dict[str, frozenset[str]] = field(default_factory=dict)  # holder -> the peers its probe reached
    said: set[str] = field(default_factory=set)  # the holders whose cut-off line is said
    nonce: peer.Nonce = field(default_factory=peer.Nonce)  # what every peer server of the run answers its probe


def _lacking(inventory_host, weights: tuple[Weights, ...], revisions: set[Revision]) -> set[Revision] | None:
    """Which of `revisions` the host's weights directories lack (no manifest of the commit); None when the host
    cannot be asked."""
    dirs = {repo.local_dir: r for w in weights for repo in w.repos if repo.commit
            for r in revisions if (r.repo_id, r.commit) == (repo.repo_id, repo.commit)}
    ok, output = shell.run_elsewhere(inventory_host, WeightsState().command(json.dumps({d: {} for d in dirs},
                                                                                       sort_keys=True)))
    if not ok:
        return None
    found = WeightsState().process(output.stdout_lines)
    return {r for d, r in dirs.items() if not found.get(d) or found[d].get("commit") != r.commit}


def _deployment_of(weights: tuple[Weights, ...], revision: Revision) -> int:
    """The index of the host's first deployment holding `revision`."""
    return next(i for i, w in enumerate(weights) for repo in w.repos
                if (repo.repo_id, repo.commit) == (revision.repo_id, revision.commit))


def resolve(inventory, fleet_workers) -> RunFanout:
    """`fleet_workers`: the run's worker hosts, each with its name, address and deployments' weights
    (deployment/gateway/membership.py's WorkerHost, resolved once per run)."""
    state = inventory.state
    in_run = {h.name: h for h in inventory if h in state.activated_hosts and h not in state.failed_hosts}
    workers = [w for w in fleet_workers if w.name in in_run and not w.problem]
    found = fanout.holders((w.name, w.address, w.weights) for w in workers)
    # Each deployment's downloads are an operation of their own: holders fetching a revision in different
    # ones would wait on each other across them.
    found = {r: holders for r, holders in found.items()
             if len({_deployment_of(next(w for w in workers if w.name == h.name).weights, r) for h in holders}) == 1}
    if not found:
        return RunFanout({})
    lacking: dict[Revision, set[str]] = {r: set() for r in found}
    held = {w.name: {r for r, holders in found.items() if any(h.name == w.name for h in holders)} for w in workers}
    # Every holder asked at once: a run's wait is one round trip, not one per host.
    asked = {w.name: gevent.spawn(_lacking, in_run[w.name], w.weights, held[w.name]) for w in workers if held[w.name]}
    gevent.joinall(list(asked.values()))
    for name, answer in asked.items():
        missing = answer.get()  # an error in the read is raised here, as it would be without the greenlet
        for revision in held[name] if missing is None else missing:
            lacking[revision].add(name)
    return RunFanout({r: holders for r, holders in found.items() if lacking[r]},
                     {r: frozenset(h.name for h in holders if h.name not in lacking[r]) for r, holders in found.items()
                      if lacking[r]})


_runs: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
_resolving = threading.Lock()  # a gevent lock under pyinfra's CLI, which monkey-patches threading


def of(inventory, fleet_workers) -> RunFanout:
    """The run's fan-out, resolved on first use (pyinfra's state: one run)."""
    # The hosts' deploy files run side by side (greenlets): the others wait for the first one's reads.
    with _resolving:
        if inventory.state not in _runs:
            _runs[inventory.state] = resolve(inventory, fleet_workers)
    return _runs[inventory.state]


@dataclass(frozen=True)
class HostPart:
    """One host's part of the run's fan-out: its peer server, and the revisions it shares with whom."""

    name: str
    run: RunFanout
    server: peer.PeerServer
    shared: dict[Revision, tuple[Holder, ...]]

    @property
    def peers(self) -> tuple[Holder, ...]:
        """The other holders of its revisions, each once."""
        found = {h.name: h for holders in self.shared.values() for h in holders if h.name != self.name}
        return tuple(found.values())

    def spec_of(self, repo: Repo) -> Callable[[list[tuple[str, int]]], dict] | None:
        """For a repo whose revision the host shares: what its fetch spec gets of the fan-out, given the hub's
        listing (path, size), made once the probes are in; None for a repo it takes from the hub alone."""
        revision = next((r for r in self.shared if (r.repo_id, r.commit) == (repo.repo_id, repo.commit)), None)
        if revision is None:
            return None
        return lambda files: self._spec(revision, files)

    def _spec(self, revision: Revision, files: list[tuple[str, int]]) -> dict:
        holders = self.shared[revision]
        names = tuple(h.name for h in holders)
        cut = fanout.cut_off(names, self.run.reached)
        if self.name in cut and self.name not in self.run.said:
            self.run.said.add(self.name)
            reached = self.run.reached.get(self.name, frozenset())
            host.log_styled(fanout.cut_off_line(self.name, [n for n in names if n != self.name and n not in reached]
                                                or [n for n in names if n != self.name], self.server.port),
                            fg="yellow")
        return fanout.fetch_spec(revision, holders, fanout.plan(names, files, cut,
                                                                self.run.complete.get(revision, ()))[self.name])


def host_part(inventory, fleet_workers, name: str, weights: tuple[Weights, ...]) -> HostPart | None:
    """`name`'s part of the run's fan-out (None: it shares nothing this run), its server as `weights` (its
    deployments', the first's settings) configure it."""
    if not weights or not any(w.fanout for w in weights):
        return None
    run = of(inventory, fleet_workers)
    shared = {r: holders for r, holders in run.shared.items() if any(h.name == name for h in holders)}
    if not shared:
        return None
    first = weights[0]
    weights_dir = posixpath.dirname(first.repos[0].repo_dir)
    me = next(h for holders in shared.values() for h in holders if h.name == name)
    allowed = tuple(h.address for holders in shared.values() for h in holders if h.name != name)
    server = peer.server(replace(first, fanout_port=me.port), weights_dir, allowed, tuple(r.path for r in shared))
    return HostPart(name, run, server, shared)


@operation()
def reachable(part: HostPart):
    """
    Probe every peer's server on the fan-out port, before any download (every host's server was started in
    the operation before): a peer is reached when it answers the run's nonce (host_scripts/peer_answers.py),
    and what each holder reaches decides who is left to the hub (fanout.cut_off). A peer that does not
    answer within REACH_S is not waited on.

    + part: this host's part of the run's fan-out (``host_part``)

    **Example:**

    .. code:: python

        sharing.reachable(name="Weights peers reachable", part=part)
    """
    yield FunctionCommand(_probe, (part,), {})


def nonce_url(holder: Holder) -> str:
    """Where `holder`'s peer server answers the run's nonce (peer.NONCE_PATH)."""
    return f"{network.url(holder.address, holder.port)}/{peer.NONCE_PATH}"


def _probe(state, host, part: HostPart) -> bool:
    peers = part.peers
    # The nonce on stdin: no command line or log of either host holds it.
    _, output = shell.run(host, inline("peer_answers", str(REACH_S), *(nonce_url(p) for p in peers)),
                          _stdin=part.run.nonce.value)
    answers = []
    for line in output.stdout_lines:
        try:
            answers.append(json.loads(line).get("ok") is True)
        except ValueError:
            continue
    part.run.reached[part.name] = frozenset(p.name for p, ok in zip(peers, answers) if ok)
    return True
