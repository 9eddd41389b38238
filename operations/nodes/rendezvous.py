"""The checks of a server spanning several nodes (group.py says how a group is declared).

Only rank 0 runs SGLang's HTTP server, so only rank 0 gets the readiness probe and a gateway
registration; and it serves only once every rank has joined its dist-init port, so its readiness
is the whole group's. What is left to check here: before anything slow, that every node reaches
rank 0's dist-init port (`reachable`); after the start, that each other rank's server is up and
joined (`joined`). Both read the group's links on that port: torch.distributed's TCP store lives
on rank 0, and every rank keeps its connection to it open for as long as it runs.
"""

import json
import shlex

from pyinfra import host
from pyinfra.api import FactBase, FunctionCommand, operation

from deployment.nodes.group import NodeGroup
from operations.basics import outcomes, polling, shell
from operations.basics.host_programs import inline

HOLD_S = 30  # rank 0 listens this long at most for the other ranks' test connections
REACH_S = 20  # a rank tries this long to connect (the ranks' checks run at the same time)


class DistInitLinks(FactBase):
    """
    The established TCP connections on a port (either end), as (local, peer) addresses.

    .. code:: python

        [{"local": ["10.0.0.1", 25000], "peer": ["10.0.0.2", 41234]}]
    """

    @staticmethod
    def default() -> list:
        return []  # nothing connected: ss prints nothing

    def command(self, port: int) -> str:
        return f"ss -Htn state established '( sport = :{int(port)} or dport = :{int(port)} )'"

    def process(self, output):
        def endpoint(text: str) -> list:
            address, _, port = text.rpartition(":")
            return [address.strip("[]").removeprefix("::ffff:"), int(port)]

        return [{"local": endpoint(fields[-2]), "peer": endpoint(fields[-1])}
                for fields in (line.split() for line in output) if len(fields) >= 4]


def peers_of_rank0(group: NodeGroup, links: list[dict]) -> set[str]:
    """On rank 0: the addresses connected to its dist-init port."""
    return {link["peer"][0] for link in links if link["local"][1] == group.dist_init_port}


def joined_rank0(group: NodeGroup, links: list[dict]) -> bool:
    """On another rank: a connection to rank 0's dist-init port is open."""
    return any(link["peer"] == [group.dist_init_host, group.dist_init_port] for link in links)


@operation()
def reachable(group: NodeGroup):
    """
    Check that every node of the group reaches rank 0's dist-init port, before anything slow.

    Rank 0 listens on it (unless its server already holds it) while each other rank connects,
    so the ranks run this at the same time; a group whose ranks are already joined passes
    from its open links. A rank that cannot connect fails, naming itself, rank 0 and the fix.

    + group: this host's part of its node group

    **Example:**

    .. code:: python

        rendezvous.reachable(name="Nodes reach rank 0", group=deployment.node_group)
    """
    links = host.get_fact(DistInitLinks, port=group.dist_init_port)
    if group.rank == 0:
        missing = set(group.addresses[1:]) - peers_of_rank0(group, links)
        if not missing:
            host.noop(f"every rank of {group.name} is connected to {group.dist_init_addr}")
            return
        yield FunctionCommand(_hold, (group,), {})
    elif joined_rank0(group, links):
        host.noop(f"rank {group.rank} of {group.name} is connected to rank 0 at {group.dist_init_addr}")
    else:
        yield FunctionCommand(_reach, (group,), {})


def _hold(state, host, group: NodeGroup) -> bool:
    _, output = shell.run(host, inline("node_reach", "hold", group.dist_init_host, str(group.dist_init_port),
                                              str(HOLD_S), *group.addresses[1:]))
    result = _result(output)
    if not result.get("ok"):
        host.log_styled(f"{host.name}: rank 0 of node group {group.name} cannot open its dist-init port "
                        f"{group.dist_init_addr} ({result.get('error')}): set node_address of {host.name} to its IP "
                        "on the network the nodes share, and free the port", fg="red")
        return False
    return True


def _reach(state, host, group: NodeGroup) -> bool:
    rank0 = group.members[0]
    if rank0 in {failed.name for failed in state.failed_hosts}:
        host.log_styled(f"{host.name}: rank 0 of node group {group.name} ({rank0}) failed earlier in this run, so "
                        f"rank {group.rank} cannot join it: fix {rank0} and deploy the group again", fg="red")
        return False
    _, output = shell.run(host, inline("node_reach", "reach", group.dist_init_host,
                                              str(group.dist_init_port), str(REACH_S)))
    result = _result(output)
    if not result.get("ok"):
        host.log_styled(f"{host.name}: rank {group.rank} of node group {group.name} cannot reach rank 0 ({rank0}) "
                        f"at {group.dist_init_addr}: {result.get('error')}. Allow TCP {group.dist_init_port} (and "
                        f"the ports NCCL picks) from {group.address} to {group.dist_init_host}, check node_address "
                        f"of {rank0}, and deploy the group's hosts in one run (not --serial, nor --limit to a part "
                        "of the group)", fg="red")
        return False
    return True


def _result(output) -> dict:
    try:
        return json.loads(output.stdout_lines[-1])
    except (IndexError, ValueError):
        return {"ok": False, "error": " ".join(output.stderr_lines or output.stdout_lines)[-300:] or "no output"}


class RankState(FactBase):
    """
    The service's state and its links on the dist-init port (a rank >= 1: its dummy health server says 200 whatever its schedulers do).

    .. code:: python

        {"active": "active", "links": [{"local": ["10.0.0.2", 41234], "peer": ["10.0.0.1", 25000]}]}
    """

    def command(self, service: str, port: int) -> str:
        return f"systemctl is-active {shlex.quote(service)}; {DistInitLinks().command(port)}"

    def process(self, output):
        return {"active": output[0] if output else "unknown", "links": DistInitLinks().process(output[1:])}


@operation()
def joined(group: NodeGroup, service: str, timeout_s: int):
    """
    Prove a rank >= 1 serves its part: its service is active and joined to rank 0's dist-init port.

    It serves no model, only a dummy health server that says 200 whatever its schedulers do (rank 0
    serves for the group and is probed by readiness), so this waits, up to `timeout_s`, for its link to
    rank 0; then fails with the journal's last lines.

    + group: this host's part of its node group (a rank >= 1)
    + service: the SGLang unit's name
    + timeout_s: how long the start may take

    **Example:**

    .. code:: python

        rendezvous.joined(name="Rank joined rank 0", group=deployment.node_group, service="sglang", timeout_s=600)
    """
    now = host.get_fact(RankState, service=service, port=group.dist_init_port)
    if now["active"] == "active" and joined_rank0(group, now["links"]):
        outcomes.note(host, joined=group.members[0])
        host.noop(f"rank {group.rank} of {group.name} is up and joined rank 0 at {group.dist_init_addr}")
        return
    yield FunctionCommand(_wait_joined, (group, service, timeout_s), {})


def _wait_joined(state, host, group: NodeGroup, service: str, timeout_s: int) -> bool:
    command = RankState().command(service, group.dist_init_port)

    def check(elapsed: float):
        _, output = shell.run(host, command)
        now = RankState().process(output.stdout_lines)
        if now["active"] == "active" and joined_rank0(group, now["links"]):
            return True, ""
        return None, (f"rank {group.rank} of {group.name}: {elapsed:.0f}s of {timeout_s}s, {service} {now['active']}, "
                      f"not yet joined to rank 0 at {group.dist_init_addr}")

    if polling.wait(host, check, interval_s=2, log_every_s=30, timeout_s=timeout_s, first_log_s=10):
        outcomes.note(host, joined=group.members[0])
        host.log_styled(f"rank {group.rank} of {group.name} is up and joined rank 0 ({group.members[0]})", fg="green")
        return True
    _, journal = shell.run(host, f"journalctl -u {shlex.quote(service)} -n 20 --no-pager -o cat")
    host.log_styled(f"{host.name}: rank {group.rank} of node group {group.name} did not join rank 0 "
                    f"({group.members[0]}) at {group.dist_init_addr} within {timeout_s}s; last lines of its "
                    f"journal:\n{journal.stdout}", fg="red")
    return False
