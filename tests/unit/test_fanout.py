"""The weights' fan-out plan (deployment/weights/fanout.py): facts of the run in, who fetches what from whom out."""

import pytest

from deployment.gateway import membership
from deployment.hosts import resolve
from deployment.knobs import BadHostData
from deployment.weights import fanout
from deployment.weights.fanout import HUB
from tests.unit.group_data import host_data
from tests.unit.test_gateway import Inventory, Run, inventory_host

QWEN = "Qwen/Qwen3.6-27B"
PINS = {"repos": {f"{QWEN}@main": "a" * 40, "z-lab/Qwen3.6-27B-DFlash@main": "b" * 40}}
# A 27B model's listing as the hub gives it: shards of unequal sizes and a few small files.
FILES = [*((f"model-{i:05d}-of-00012.safetensors", 4_900_000_000 - i * 1000) for i in range(1, 12)),
         ("model-00012-of-00012.safetensors", 1_200_000_000), ("config.json", 2_000), ("tokenizer.json", 11_000_000)]


def arrival(sources: dict, names: tuple[str, ...], path: str) -> dict[str, int]:
    """The round in which each host has `path` by the plan, checked to be a schedule that can run: its seed
    takes it from the hub in round 0, every other host from a peer that had it in an earlier round, and each
    host serves at most one peer a round (a holder's upload is shared, not multiplied, among those it serves
    at once)."""
    when = {name: sources[name][path].round for name in names}
    first = {name: sources[name][path].sources[0] for name in names}
    assert [n for n in names if first[n] == HUB] == [n for n in names if when[n] == 0]
    for name in names:
        if first[name] != HUB:
            assert when[first[name]] < when[name], f"{name} takes {path} from {first[name]}, which has it no sooner"
    for round_ in range(1, max(when.values()) + 1):
        servers = [first[n] for n in names if when[n] == round_]
        assert len(servers) == len(set(servers)), f"round {round_} of {path}: a host serves two at once"
    return when


@pytest.mark.parametrize("count", [2, 3, 4, 5, 8, 13, 16])
def test_every_host_has_every_file_after_log2_n_rounds_each_file_from_the_hub_once(count):
    names = tuple(f"gpu{i}" for i in range(count))
    sources = fanout.plan(names, FILES)
    for path, _ in FILES:
        when = arrival(sources, names, path)
        assert sorted(when.values()).count(0) == 1  # one host takes it from the hub
        assert max(when.values()) == fanout.rounds(count) == (count - 1).bit_length()
        for name in names:  # every chain ends at the hub, after peers that had the file before
            chain = sources[name][path].sources
            assert chain[-1] == HUB and [when[p] for p in chain[:-1]] == sorted((when[p] for p in chain[:-1]),
                                                                                 reverse=True)


def test_the_hub_bytes_are_shared_among_the_hosts():
    names = ("a", "b", "c")
    sources = fanout.plan(names, FILES)
    from_hub = {n: sum(size for path, size in FILES if sources[n][path].sources == (HUB,)) for n in names}
    total = sum(size for _, size in FILES)
    assert sum(from_hub.values()) == total  # every byte from the hub once
    assert max(from_hub.values()) - min(from_hub.values()) <= max(size for _, size in FILES)
    assert min(from_hub.values()) > total / 4


def test_a_host_cut_off_from_its_peers_takes_everything_from_the_hub_and_no_peer_counts_on_it():
    names = ("a", "b", "c", "d")
    sources = fanout.plan(names, FILES, cut_off=["b"])
    assert set(sources["b"].values()) == {fanout.Take(0, (HUB,))}
    assert not any("b" in take.sources for n in "acd" for take in sources[n].values())
    for path, _ in FILES:
        assert max(arrival(sources, ("a", "c", "d"), path).values()) == fanout.rounds(3)
    alone = fanout.plan(("a", "b"), FILES, cut_off=["a"])  # one holder left: no fan-out at all
    assert {take for files in alone.values() for take in files.values()} == {fanout.Take(0, (HUB,))}


def worker(name: str, address: str, **data):
    return inventory_host(name, ["rtx_pro_6000_pcie"], ssh_hostname=address, profile="qwen36_ddtree", pins=PINS,
                          **data)


def test_the_holders_come_from_the_fleet_resolved_once_and_share_a_pinned_revision_only():
    inventory = type("ThisRun", (Inventory,), {"state": Run()})([worker("a", "10.0.0.1"), worker("b", "10.0.0.2"),
                           worker("off", "10.0.0.3", weights_fanout=False),
                           worker("c", "10.0.0.4", weights_fanout_port=31500),
                           worker("odd", "10.0.0.6/evil?"),  # no address a peer's URL may hold
                           inventory_host("moving", ["rtx_pro_6000_pcie"], ssh_hostname="10.0.0.5",
                                          profile="qwen36_ddtree")])  # main, unpinned: no commit yet
    fleet = membership.of(inventory)
    found = fanout.holders((w.name, w.address, w.weights) for w in fleet.workers)
    target = fanout.Revision(QWEN, "a" * 40, "Qwen--Qwen3.6-27B/" + "a" * 40)
    assert set(found) == {target, fanout.Revision("z-lab/Qwen3.6-27B-DFlash", "b" * 40,
                                                  "z-lab--Qwen3.6-27B-DFlash/" + "b" * 40)}
    assert found[target] == (fanout.Holder("a", "10.0.0.1", 30900), fanout.Holder("b", "10.0.0.2", 30900),
                             fanout.Holder("c", "10.0.0.4", 31500))
    assert fanout.peer_url(found[target][2], target) == "http://10.0.0.4:31500/Qwen--Qwen3.6-27B/" + "a" * 40
    lone = type("AnotherRun", (Inventory,), {"state": Run()})([worker("a", "10.0.0.1"), worker("off", "10.0.0.3", weights_fanout=False)])
    assert fanout.holders((w.name, w.address, w.weights) for w in membership.of(lone).workers) == {}


def test_each_hosts_fetch_spec_names_its_peers_as_the_fetcher_accepts_them():
    from tests.helpers import host_programs_importable
    host_programs_importable()
    import weights_sources

    revision = fanout.Revision(QWEN, "a" * 40, "Qwen--Qwen3.6-27B/" + "a" * 40)
    holders_of = tuple(fanout.Holder(n, f"10.0.0.{i + 1}", 30900) for i, n in enumerate("abcd"))
    sources = fanout.plan(tuple(h.name for h in holders_of), FILES)
    for holder in holders_of:
        part = fanout.fetch_spec(revision, holders_of, sources[holder.name])
        assert weights_sources.spec_problem({"commit": revision.commit, **part}) is None
        assert holder.name not in part["peers"]  # never itself
        assert set(part["rounds"]) == {path for path, _ in FILES}
        seeded = {path for path, take in sources[holder.name].items() if take.round == 0}
        assert seeded and seeded.isdisjoint(part["sources"])  # what it takes from the hub names no peer


@pytest.mark.parametrize("key, value", [("weights_fanout", "sometimes"), ("weights_cache", "keep"),
                                        ("weights_fanout_port", "30900; id"), ("weights_fanout_port", 70000)])
def test_fanout_knobs_are_refused_when_malformed(key, value):
    with pytest.raises(BadHostData, match=key):
        resolve(host_data("rtx_pro_6000_pcie", **{key: value}), "rtx_pro_6000_pcie")


def test_fanout_is_on_and_the_cache_off_by_default():
    weights = resolve(host_data("rtx_pro_6000_pcie"), "rtx_pro_6000_pcie").weights
    assert (weights.fanout, weights.cache, weights.fanout_port) == (True, False, 30900)


def test_the_host_the_others_do_not_reach_is_the_one_left_to_the_hub():
    names = ("a", "b", "c")
    # c is cut off (its routes to a and b are gone): a and b reach each other and not c, c reaches no one.
    assert fanout.cut_off(names, {"a": frozenset("b"), "b": frozenset("a"), "c": frozenset()}) == ("c",)
    # The first in inventory order cut off: still only it, not the others from it.
    assert fanout.cut_off(names, {"a": frozenset(), "b": frozenset("c"), "c": frozenset("b")}) == ("a",)
    everyone = {n: frozenset(set(names) - {n}) for n in names}
    assert fanout.cut_off(names, everyone) == ()
    # One way is not enough (a reaches c, c does not reach a), and a host that never probed reaches no one.
    assert fanout.cut_off(names, {**everyone, "c": frozenset("b")}) == ("c",)
    assert fanout.cut_off(names, {"a": frozenset("bc"), "b": frozenset("ac")}) == ("c",)
    line = fanout.cut_off_line("c", ["a", "b"], 30900)
    assert line == ("c and a, b do not reach each other on port 30900 (weights_fanout_port): "
                    "c takes its weights from the hub")


def test_each_hosts_spec_leaves_the_host_cut_off_to_the_hub_and_says_so_once():
    from pyinfra.context import ctx_host

    from operations.weights import sharing
    from tests.unit.fakehost import FakeHost

    revision = fanout.Revision(QWEN, "a" * 40, "Qwen--Qwen3.6-27B/" + "a" * 40)
    holders = tuple(fanout.Holder(n, f"10.0.0.{i}", 30900) for i, n in enumerate(("a", "b", "c"), 1))
    run = sharing.RunFanout({revision: holders}, reached={"a": frozenset("b"), "b": frozenset("a"), "c": frozenset()})
    weights = resolve(host_data("rtx_pro_6000_pcie"), "rtx_pro_6000_pcie").weights
    specs, said = {}, []
    for name in ("a", "b", "c", "c"):  # c's second deployment of the revision: said once
        server = sharing.peer.server(weights, "/srv/specfleet/models", ("10.0.0.9",), (revision.path,))
        part = sharing.HostPart(name, run, server, {revision: holders})
        on = FakeHost({}, name=name)
        with ctx_host.use(on):
            specs[name] = part._spec(revision, FILES)
        said += on.logged
    assert said == ["c and a, b do not reach each other on port 30900 (weights_fanout_port): "
                    "c takes its weights from the hub"]
    assert specs["c"]["peers"] == {} and specs["c"]["sources"] == {}
    assert set(specs["a"]["peers"]) | set(specs["b"]["peers"]) == {"a", "b"}
    assert specs["b"]["peers"]["a"] == "http://10.0.0.1:30900/Qwen--Qwen3.6-27B/" + "a" * 40


def test_a_holder_that_has_the_revision_already_seeds_every_file_and_the_hub_serves_nothing():
    names = ("a", "b", "c", "d")
    sources = fanout.plan(names, FILES, complete=["c"])
    for path, _ in FILES:
        when = arrival(sources, names, path)
        assert [n for n in names if when[n] == 0] == ["c"]
        assert max(when.values()) == fanout.rounds(4)
    both = fanout.plan(names, FILES, cut_off=["c"], complete=["b", "c"])  # c cut off: b seeds all
    assert {both[n][path].sources[-2:] for n in "ad" for path, _ in FILES} <= {("b", HUB), ("d", "b", HUB),
                                                                               ("a", "b", HUB)}
    assert all(both["b"][path] == fanout.Take(0, (HUB,)) for path, _ in FILES)


def test_a_holder_known_by_a_name_takes_no_part_as_no_name_is_resolved_on_the_controller():
    """A name resolved on the controller would let whoever answers its DNS query into every peer's allow list:
    the inventory's address is taken as it is, and a host whose address is a name fetches from the hub alone."""
    inventory = type("NamedRun", (Inventory,), {"state": Run()})([worker("a", "10.0.0.1"), worker("b", "10.0.0.2"),
                                                                    worker("named", "gpu3.example")])
    found = fanout.holders((w.name, w.address, w.weights) for w in membership.of(inventory).workers)
    assert found and {h.name for holders in found.values() for h in holders} == {"a", "b"}


def test_the_probe_counts_a_peer_reached_only_when_it_answers_the_runs_nonce():
    """Whatever took the fan-out's port on a peer (a process that held it while no peer server ran, so the run's
    nginx failed to bind) accepts connections too: a TCP connect would count it, the nonce does not. The nonce
    reaches the probe on stdin, as the deploy sends it."""
    import json
    import socket
    import subprocess
    import sys
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from operations.basics.host_programs import program

    answers = {"/nonce": b"n" * 32, "/other": b"squatter", "/moved": None}

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_GET(self):
            body = answers[self.path]
            self.send_response(302 if body is None else 200)
            if body is None:
                self.send_header("Location", "/nonce")  # followed, it would answer the nonce
            self.send_header("Content-Length", str(len(body or b"")))
            self.end_headers()
            self.wfile.write(body or b"")

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    mute = socket.create_server(("127.0.0.1", 0))  # accepts (the kernel's backlog), never answers
    closed = socket.create_server(("127.0.0.1", 0))
    closed_port = closed.getsockname()[1]
    closed.close()
    base = f"http://127.0.0.1:{server.server_port}"
    urls = [f"{base}/nonce", f"{base}/other", f"{base}/moved", f"http://127.0.0.1:{mute.getsockname()[1]}/nonce",
            f"http://127.0.0.1:{closed_port}/nonce"]
    try:
        probe = subprocess.run([sys.executable, "-c", program("peer_answers"), "1", *urls], input="n" * 32,
                               capture_output=True, text=True, timeout=60)
    finally:
        server.shutdown()
        server.server_close()
        mute.close()
    assert [json.loads(line)["ok"] for line in probe.stdout.splitlines()] == [True, False, False, False, False]
