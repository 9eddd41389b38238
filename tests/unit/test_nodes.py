"""One model over several nodes: the inventory's node groups resolved and refused (operations/nodes.py), the
command line each node gets (checked by the REAL SGLang 0.5.23), the links the checks read, the reach
program both ends run, and the gateway registering rank 0 only."""

import json
import socket
import subprocess
import sys
import threading
from dataclasses import replace

import pytest

from deployment.gateway.config import resolve as resolve_gateway
from deployment.gateway.membership import resolve as fleet, workers
from deployment.hosts import resolve
from deployment.knobs import BadHostData
from deployment.nodes.group import members
from deployment.server.command_line import server_args
from operations.basics.host_programs import program
from operations.nodes import rendezvous
from operations.nodes.rendezvous import DistInitLinks, RankState, joined_rank0, peers_of_rank0
from tests.sglang_real import resolve_many_with_real_sglang
from tests.unit.fakehost import run
from tests.unit.resolution_cases import case, deployment, lab_repos
from tests.unit.test_gateway import inventory_host
from tests.unit.test_sglang_resolution import standin_resolve

GROUP = {"tp16": dict(tp_size=16, dist_init_port=25000, socket_ifname="ens1f0")}


def node(name: str, rank, address: str, groups=("b200_nvlink",), **data):
    return inventory_host(name, list(groups), **{"ssh_hostname": address, "node_group": "tp16", "node_rank": rank,
                                                 "node_groups": GROUP, **data})


def two_nodes(**changes):
    return [node("b200-a", 0, "10.0.0.1", **changes.get("a", {})),
            node("b200-b", 1, "10.0.0.2", **changes.get("b", {}))]


def resolved(inventory, host):
    return resolve(host.data, next(g for g in host.groups if g != "gateway"), members(inventory, host))


def test_each_node_gets_its_rank_the_group_tp_size_and_the_node_network():
    inventory = two_nodes()
    rank0, rank1 = (resolved(inventory, host) for host in inventory)
    args = server_args(rank1.replicas[0])
    assert args[args.index("--tp-size") + 1] == "16"  # over both nodes, 8 GPUs each
    assert args[args.index("--nnodes") + 1:args.index("--nnodes") + 6] == [
        "2", "--node-rank", "1", "--dist-init-addr", "10.0.0.1:25000"]
    assert server_args(rank0.replicas[0])[server_args(rank0.replicas[0]).index("--node-rank") + 1] == "0"
    # Rank 0 serves HTTP and drains on a stop; rank 1 holds no request of its own (its unit's KillMode).
    assert [r.engine.drains_on_stop for d in (rank0, rank1) for r in d.replicas] == [True, False]
    assert rank1.engine.env["NCCL_SOCKET_IFNAME"] == rank1.engine.env["GLOO_SOCKET_IFNAME"] == "ens1f0"
    assert (rank0.engine.env["SGLANG_HOST_IP"], rank1.engine.env["SGLANG_HOST_IP"]) == ("10.0.0.1", "10.0.0.2")
    assert rank0.node_group.serves_http and not rank1.node_group.serves_http
    assert rank0.engine.env["SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN"] == "1"  # the profile's env stays


def test_a_host_without_a_group_serves_alone():
    host = inventory_host("solo", ["b200_nvlink"], node_groups=GROUP)
    d = resolved([host], host)
    assert d.node_group is None and "--nnodes" not in server_args(d.replicas[0]) and d.engine.tp_size == 8


@pytest.mark.parametrize("inventory, refusal", [
    (two_nodes(b={"node_rank": 0}), "b200-a/b200-b=0"),  # two ranks 0
    (two_nodes(b={"node_rank": 2}), "b200-a=0, b200-b=2: give each member its own rank, 0 to 1"),
    (two_nodes(b={"node_rank": "one"}), "node_rank of b200-b='one' is not a whole number"),
    ([node("b200-a", 0, "10.0.0.1"), node("b200-b", 1, "10.0.0.2", groups=("b300_nvlink",))], "mixes host classes"),
    (two_nodes(b={"profile": "qwen36_ddtree"}), "mixes profiles"),
    (two_nodes(a={"node_groups": {"tp16": {**GROUP["tp16"], "tp_size": 15}}}), "tp_size must be divisible"),
    (two_nodes(a={"node_groups": {"tp16": {**GROUP["tp16"], "tp_size": 32}}}), "of at most 16"),
    (two_nodes(a={"node_groups": {"tp16": {**GROUP["tp16"], "dist_init_port": 29995}}}), "collides with the server"),
    (two_nodes(a={"node_groups": {"tp16": {**GROUP["tp16"], "socket_ifname": "eth0; reboot"}}}), "socket_ifname"),
    (two_nodes(a={"node_group": "tp32"}), "node_group='tp32' is not a key of node_groups (tp16)"),
    (two_nodes(a={"ssh_hostname": "b200-a.example"}), "b200-a's node_address='b200-a.example' is not an IP address: set node_address"),
    (two_nodes()[:1], "has one member (b200-a)"),
])
def test_a_group_that_cannot_serve_is_refused_naming_the_knob_and_the_fix(inventory, refusal):
    with pytest.raises(BadHostData) as refused:
        resolved(inventory, inventory[0])
    assert refusal in str(refused.value)


def test_the_node_address_knob_names_the_node_network_apart_from_ssh():
    inventory = two_nodes(a={"node_address": "192.168.100.1"})
    args = server_args(resolved(inventory, inventory[1]).replicas[0])
    assert args[args.index("--dist-init-addr") + 1] == "192.168.100.1:25000"


def test_the_gateway_registers_rank0_only():
    gateway = inventory_host("gw", ["gateway"])
    inventory = [gateway, *two_nodes(a={"bind_address": "0.0.0.0"}, b={"bind_address": "0.0.0.0"})]
    found = workers(fleet(inventory), gateway, resolve_gateway(gateway.data).model)
    assert [(w.name, w.url) for w in found] == [("b200-a", "http://10.0.0.1:30000")]


def test_the_real_sglang_accepts_each_nodes_command_line_and_refuses_an_uneven_tp_size(tmp_path):
    repos = lab_repos(tmp_path)
    inventory = two_nodes()
    cases = []
    for host in inventory:
        d = resolved(inventory, host)
        real = deployment("b200_nvlink", "kimi_k26_dflash", repos)
        cases.append(case(replace(real, engine=replace(real.engine, node_args=d.engine.node_args, layout=d.engine.layout,
                                                       env=d.engine.env))))
    uneven = {**cases[1], "argv": [("15" if prev == "--tp-size" else a) for prev, a in
                                   zip([""] + cases[1]["argv"], cases[1]["argv"])]}
    real = resolve_many_with_real_sglang([*cases, uneven])
    standin = [standin_resolve(c, tmp_path) for c in (*cases, uneven)]
    for answers in (real, standin):  # the lab's stand-in agrees with the release
        rank0, rank1, refused = answers
        for answer, rank in ((rank0, 0), (rank1, 1)):
            assert "error" not in answer, answer
            r = answer["resolved"]
            assert (r["nnodes"], r["node_rank"], r["dist_init_addr"], r["tp_size"]) == (2, rank, "10.0.0.1:25000", 16)
        assert refused["error"] == "AssertionError: tp_size must be divisible by number of nodes"


# `ss -Htn state established '( sport = :25000 or dport = :25000 )'` on a rank 0 with one rank joined
# (IPv4 and an IPv4-mapped IPv6 socket), and on that rank.
SS_RANK0 = ["0      0      10.0.0.1:25000 10.0.0.2:41234",
            "0      0      [::ffff:10.0.0.3]:25000 [::ffff:10.0.0.9]:5555"]
SS_RANK1 = ["0      0      10.0.0.2:41234 10.0.0.1:25000"]


def test_the_links_on_the_dist_init_port_say_who_joined():
    inventory = two_nodes()
    rank0, rank1 = (resolved(inventory, host).node_group for host in inventory)
    links = DistInitLinks().process(SS_RANK0)
    assert links[1] == {"local": ["10.0.0.3", 25000], "peer": ["10.0.0.9", 5555]}
    assert peers_of_rank0(rank0, links) == {"10.0.0.2", "10.0.0.9"}
    assert joined_rank0(rank1, DistInitLinks().process(SS_RANK1))
    assert not joined_rank0(rank1, DistInitLinks().process(SS_RANK0))
    assert DistInitLinks().default() == []  # pyinfra's value when ss prints nothing


def reach_program(*args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", program("node_reach"), *args], stdout=subprocess.PIPE, text=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_both_ends_of_the_reach_check_meet_and_a_closed_port_is_named():
    port = str(free_port())
    hold, reach = reach_program("hold", "127.0.0.1", port, "10", "127.0.0.1"), None
    reach = reach_program("reach", "127.0.0.1", port, "10")
    assert json.loads(reach.communicate(timeout=20)[0]) == {"ok": True} and reach.returncode == 0
    assert json.loads(hold.communicate(timeout=20)[0]) == {"ok": True, "seen": ["127.0.0.1"]}

    nobody = reach_program("reach", "127.0.0.1", str(free_port()), "1")
    answer = json.loads(nobody.communicate(timeout=20)[0])
    assert nobody.returncode == 1 and answer["error"].startswith("connection refused")


def test_rank0_whose_port_the_server_holds_leaves_it_and_a_foreign_address_is_named():
    with socket.create_server(("127.0.0.1", 0)) as server:
        threading.Thread(target=server.accept, daemon=True).start()
        held = reach_program("hold", "127.0.0.1", str(server.getsockname()[1]), "5", "10.0.0.2")
        assert json.loads(held.communicate(timeout=20)[0])["ok"]
    foreign = reach_program("hold", "192.0.2.1", str(free_port()), "5")
    answer = json.loads(foreign.communicate(timeout=20)[0])
    assert foreign.returncode == 1 and answer["error"] == "192.0.2.1 is not an address of this host"


def test_reachability_is_checked_until_the_group_is_joined_then_read_from_its_links():
    inventory = two_nodes()
    rank0, rank1 = (resolved(inventory, host) for host in inventory)
    for d in (rank0, rank1):  # not joined yet: both ends run the check (at execution, together)
        commands, _ = run(rendezvous.reachable, {DistInitLinks: []}, group=d.node_group)
        assert [c.function for c in commands] == [rendezvous._hold if d is rank0 else rendezvous._reach]
    assert run(rendezvous.reachable, {DistInitLinks: DistInitLinks().process(SS_RANK0)}, group=rank0.node_group) == (
        [], ["every rank of tp16 is connected to 10.0.0.1:25000"])
    assert run(rendezvous.reachable, {DistInitLinks: DistInitLinks().process(SS_RANK1)}, group=rank1.node_group)[0] == []


def test_a_rank_is_proven_up_and_joined_or_waited_for():
    inventory = two_nodes()
    rank1 = resolved(inventory, inventory[1])
    up = {"active": "active", "links": DistInitLinks().process(SS_RANK1)}
    group = dict(group=rank1.node_group, service=rank1.replicas[0].service_name, timeout_s=60)
    assert run(rendezvous.joined, {RankState: up}, **group)[0] == []
    for down in ({**up, "active": "activating"}, {**up, "links": []}):
        commands, _ = run(rendezvous.joined, {RankState: down}, **group)
        assert [c.function for c in commands] == [rendezvous._wait_joined]
    assert RankState().process(["active", *SS_RANK1])["links"] == DistInitLinks().process(SS_RANK1)
