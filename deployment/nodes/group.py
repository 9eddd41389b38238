"""Node groups: one SGLang server spanning several hosts (one model, tensor parallel over all their GPUs).

A host joins a node group with two knobs of its inventory data, `node_group` (a key of
`node_groups` in group_data) and `node_rank`; rank 0 is the node that serves HTTP, is
health-checked and registered with a gateway; the others join it over its `dist_init_port`.
Which hosts form a group is read from the inventory itself (`members()`): every host whose
`node_group` names it. `group()` checks the group as a whole (ranks unique and 0..N-1, one
class, one profile, a TP size SGLang accepts), so `resolve()` refuses a host of a broken group
before anything is touched, naming the knob, its value and what is accepted.
"""

import ipaddress
import re
from dataclasses import dataclass
from typing import Any

from deployment import knobs
from deployment.knobs import BadHostData

GROUP_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
# NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME: interface names (at most 15 characters, the kernel's
# IFNAMSIZ), comma-separated; NCCL reads each as a prefix, Gloo as an exact name.
INTERFACES = re.compile(r"[A-Za-z0-9_.-]{1,15}(,[A-Za-z0-9_.-]{1,15})*")


@dataclass(frozen=True)
class NodeGroup:
    """This host's part in a server spanning several nodes."""

    name: str
    rank: int  # this host's node rank; 0 serves HTTP
    members: tuple[str, ...]  # inventory host names, in rank order
    addresses: tuple[str, ...]  # each member's IP on the node network, in rank order
    tp_size: int  # over all nodes
    dist_init_port: int  # on rank 0: torch.distributed's TCP store, which every other rank joins
    socket_ifname: str | None  # the interface(s) NCCL and Gloo use between the nodes

    @property
    def nnodes(self) -> int:
        return len(self.members)

    @property
    def serves_http(self) -> bool:
        """Only rank 0 runs SGLang's HTTP server (0.5.23 entrypoints/http_server.py: node_rank >= 1 returns)."""
        return self.rank == 0

    @property
    def address(self) -> str:
        return self.addresses[self.rank]

    @property
    def dist_init_host(self) -> str:
        return self.addresses[0]

    @property
    def dist_init_addr(self) -> str:
        return f"{self.dist_init_host}:{self.dist_init_port}"

    def server_args(self) -> list[str]:
        return ["--nnodes", str(self.nnodes), "--node-rank", str(self.rank), "--dist-init-addr", self.dist_init_addr]

    def env(self) -> dict[str, str]:
        """The network the ranks talk over: NCCL's and Gloo's interface, and SGLang's own address."""
        interfaces = {"NCCL_SOCKET_IFNAME": self.socket_ifname, "GLOO_SOCKET_IFNAME": self.socket_ifname}
        return {**({k: v for k, v in interfaces.items() if v}), "SGLANG_HOST_IP": self.address}


def members(inventory, host) -> dict[str, tuple[Any, list[str]]] | None:
    """The inventory's hosts in `host`'s node group, name -> (data, groups); None if it serves alone."""
    name = getattr(host.data, "node_group", None)
    if name is None:
        return None
    return {other.name: (other.data, list(other.groups)) for other in inventory
            if getattr(other.data, "node_group", None) == name}


def _address(name: str, data: Any) -> str:
    """A member's IP on the node network: `node_address`, else its `ssh_hostname` if that is an IP."""
    value = getattr(data, "node_address", None) or getattr(data, "ssh_hostname", None) or name
    try:
        return str(ipaddress.ip_address(value))
    except ValueError:
        raise knobs.refused(f"{name}'s node_address", value, "set node_address to its IP on the network the "
                            "nodes share (--dist-init-addr and the NCCL/Gloo traffic go there)",
                            wrong="is not an IP address") from None


def group(data: Any, host_class: str, profile: str, gpus_per_node: int, port: int,
          group_members: dict[str, tuple[Any, list[str]]] | None) -> NodeGroup | None:
    """This host's node group from its data and its members' (`members()`), checked as a whole; None
    if the host serves alone."""
    name = getattr(data, "node_group", None)
    if name is None:
        return None
    name = knobs.matching("node_group", name, GROUP_NAME, "a group name (letters, digits, _.-)")
    settings = (getattr(data, "node_groups", None) or {}).get(name)
    if not isinstance(settings, dict):
        defined = ", ".join(sorted(getattr(data, "node_groups", None) or {})) or "none defined"
        raise knobs.refused("node_group", name, "define it in group_data (node_groups, see group_data/all.py)",
                            wrong=f"is not a key of node_groups ({defined})")
    if group_members is None:
        raise ValueError("nodes.group needs the group's members (nodes.members(inventory, host))")
    where = f"node_groups[{name!r}]"
    ranks: dict[int, list[str]] = {}
    for member, (member_data, groups) in sorted(group_members.items()):
        rank = knobs.integer(f"node_rank of {member}", getattr(member_data, "node_rank", None))
        ranks.setdefault(rank, []).append(member)
        if host_class not in groups:
            raise BadHostData(f"node group {name!r} mixes host classes ({member} is not in {host_class}, this "
                              "host's class): one server needs the same GPUs on every node")
        if getattr(member_data, "profile", None) != profile:
            raise BadHostData(f"node group {name!r} mixes profiles ({member}: "
                              f"{getattr(member_data, 'profile', None)!r}, this host: {profile!r}): every node "
                              "serves the same model")
    shared = sorted(r for r, hosts in ranks.items() if len(hosts) > 1)
    if shared or sorted(ranks) != list(range(len(ranks))):
        listing = ", ".join(f"{'/'.join(hosts)}={rank}" for rank, hosts in sorted(ranks.items()))
        raise BadHostData(f"node group {name!r} has node_rank {listing}: give each member its own rank, "
                          f"0 to {len(group_members) - 1} (rank 0 serves HTTP)")
    if len(ranks) < 2:
        raise BadHostData(f"node group {name!r} has one member ({', '.join(group_members)}): a group spans "
                          "at least two hosts; remove node_group from a host that serves alone")
    ordered = tuple(ranks[rank][0] for rank in range(len(ranks)))
    nnodes = len(ordered)
    tp_size = knobs.integer(f"{where}['tp_size']", settings.get("tp_size"), minimum=1)
    # SGLang's own rule (0.5.23 arg_groups/validation_hook.py check_server_args), and each node has its GPUs.
    if tp_size % nnodes or tp_size // nnodes > gpus_per_node:
        raise knobs.refused(f"{where}['tp_size']", tp_size, f"use a multiple of {nnodes} of at most "
                            f"{nnodes * gpus_per_node} (SGLang: tp_size must be divisible by number of nodes)",
                            wrong=f"does not fit {nnodes} nodes of {gpus_per_node} GPUs ({host_class})")
    dist_init_port = knobs.integer(f"{where}['dist_init_port']", settings.get("dist_init_port"), minimum=1024,
                                   maximum=65535 - 7)  # with attention DP SGLang also takes the next 6 ports
    if port in range(dist_init_port, dist_init_port + 7):
        raise knobs.refused(f"{where}['dist_init_port']", dist_init_port, "pick another",
                            wrong=f"collides with the server's port {port} (SGLang uses the dist-init port and the "
                                  "6 after it)")
    interfaces = settings.get("socket_ifname")
    if interfaces is not None:
        interfaces = knobs.matching(f"{where}['socket_ifname']", interfaces, INTERFACES,
                                    "interface names, comma-separated (e.g. eth0 or ens1f0,ens1f1)")
    return NodeGroup(name=name, rank=knobs.integer("node_rank", getattr(data, "node_rank", None)), members=ordered,
                     addresses=tuple(_address(member, group_members[member][0]) for member in ordered),
                     tp_size=tp_size, dist_init_port=dist_init_port, socket_ifname=interfaces)
