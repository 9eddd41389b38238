"""Servers spanning several nodes (node groups), as deployed: rank 0 serves for its group with every rank
joined to its dist-init port; every other rank's server is up and joined (it serves no model, only a dummy health server).

Hosts that serve alone skip these; the rest of tests/deployed checks every node's unit, software and
weights, and rank 0's serving (tests/deployed/test_serving.py).
"""

import pytest

from operations.nodes.rendezvous import DistInitLinks, RankState, joined_rank0, peers_of_rank0
from tests.deployed.test_serving import body_json, serving


def node_group(target, rank0: bool):
    group = target.deployment.node_group
    if group is None:
        pytest.skip(f"{target.name} serves alone (no node_group)")
    if group.serves_http != rank0:
        pytest.skip(f"{target.name} is rank {group.rank} of {group.name}")
    return group


def test_rank0_serves_for_its_group_with_every_rank_joined(target):
    g = node_group(target, rank0=True)
    health = serving(target, target.deployment.replicas[0])["health"]
    assert health["status"] == 200, (f"{target.name}: expected rank 0 of {g.name} to answer /health_generate with "
                                     f"200, found {health['status']}: {health['body'][:200]} (a rank that is down "
                                     f"keeps the group from serving: check {', '.join(g.members[1:])})")
    info, problem = body_json(target, "/server_info", serving(target, target.deployment.replicas[0])["server_info"])
    assert problem is None, f"{target.name}: {problem}"
    found = (info.get("nnodes"), info.get("node_rank"), info.get("dist_init_addr"), info.get("tp_size"))
    assert found == (g.nnodes, 0, g.dist_init_addr, g.tp_size), (
        f"{target.name}: expected /server_info nnodes, node_rank, dist_init_addr, tp_size "
        f"{(g.nnodes, 0, g.dist_init_addr, g.tp_size)}, found {found}")
    links = target.facts(links=(DistInitLinks(), {"port": g.dist_init_port}))["links"]
    missing = sorted(set(g.addresses[1:]) - peers_of_rank0(g, links))
    assert not missing, (f"{target.name}: expected every rank of {g.name} connected to {g.dist_init_addr}, found "
                         f"none from {', '.join(missing)}")


def test_other_rank_is_up_and_joined_to_rank0(target):
    g, d = node_group(target, rank0=False), target.deployment.replicas[0]
    state = target.facts(rank=(RankState(), {"service": d.service_name, "port": g.dist_init_port}))["rank"]
    assert state["active"] == "active", (f"{target.name}: expected rank {g.rank} of {g.name} running "
                                         f"({d.service_name} active), found {state['active']}: check "
                                         f"`journalctl -u {d.service_name}`")
    assert joined_rank0(g, state["links"]), (
        f"{target.name}: expected rank {g.rank} of {g.name} connected to rank 0 ({g.members[0]}) at "
        f"{g.dist_init_addr}, found {[link['peer'] for link in state['links']] or 'no link on that port'}")
