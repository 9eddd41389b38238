"""The fleet as its gateways see it: which workers each gateway routes to, and each worker's gateways.

The inventory is resolved once per run (`of`): every worker host's deployments (`resolve_host`, whose
checks refuse a host with one line) and every gateway host's gateway. A gateway's workers (`workers`)
are the inventory's replicas serving its model, each at its URL on the network the gateway reaches; a
worker's gateways (`gateways`, `routes`) say where each one is driven (on its own host, with its admin
key) and where the worker reaches it as a client. "Same host?" is asked of `same_host` alone: a worker
on its gateway's host is reached on loopback, whatever it binds. The same resolution says which weights
each worker host deploys: the weights' fan-out (deployment/weights/fanout.py) groups the hosts by them.
"""

import weakref
from dataclasses import dataclass, replace

from deployment import hosts, network, roles
from deployment.gateway import config
from deployment.gateway.config import Gateway
from deployment.knobs import BadHostData
from deployment.nodes.group import members
from deployment.server.config import Server, ServiceHost
from deployment.weights.config import Weights


@dataclass(frozen=True)
class Worker:
    name: str  # the inventory host it runs on
    url: str  # as the gateway reaches it
    problem: str | None = None  # why it cannot be registered
    replica: str = ""  # its SGLang unit on that host (one worker per replica)


@dataclass(frozen=True)
class Route:
    """One gateway of a worker's host: its control plane, driven on the gateway's own host (to drain and
    rejoin the worker's replicas), and its API as the worker's host reaches it as a client (the bench)."""

    gateway: str  # the gateway host's name: where its workers are changed, with its admin key
    control: Gateway | None  # the gateway as resolved from its host's data (None: refused, see problem)
    worker_address: str  # where that gateway reaches the worker's host (``worker_address``)
    address: str = ""  # where the worker's host reaches the gateway's API; "" when it cannot (loopback elsewhere)
    problem: str | None = None
    local: bool = False  # the gateway runs on the worker's host (``same_host``)
    gateway_address: str = ""  # the gateway host's own (network.inventory_address): it connects to workers from it

    @property
    def model(self) -> str:
        return self.control.model if self.control else ""

    @property
    def port(self) -> int:
        return self.control.port

    def worker_url(self, port: int) -> str:
        return network.url(self.worker_address, port)


@dataclass(frozen=True)
class WorkerHost:
    """An inventory host serving a model, resolved once per run."""

    name: str
    address: str  # on the serving network (network.inventory_address)
    servers: tuple[Server, ...] = ()  # its replicas serving HTTP, of every model (a node group's rank 0 only)
    problem: str | None = None  # its data is refused (its own deploy refuses it too)
    weights: tuple[Weights, ...] = ()  # each of its deployments' (every rank of a node group loads them)


@dataclass(frozen=True)
class GatewayHost:
    """An inventory host of the `gateway` group, resolved once per run."""

    name: str
    address: str  # on the serving network (network.inventory_address)
    gateway: Gateway | None  # None: refused, see problem
    problem: str | None = None


@dataclass(frozen=True)
class Fleet:
    """The inventory as its gateways see it, each host resolved once (``resolve``; per run, ``of``)."""

    workers: tuple[WorkerHost, ...]  # in inventory order
    gateways: tuple[GatewayHost, ...]


def same_host(one, other) -> bool:
    """Whether two inventory hosts (pyinfra's, or their records here) are one: pyinfra hands the deploy a
    proxy of its host, so hosts are told apart by name, not identity."""
    return one.name == other.name


def worker_address(local: bool, address: str) -> str:
    """Where a gateway reaches the servers of a worker host at `address` (network.inventory_address):
    loopback on its own host (`local`, ``same_host``), else that address."""
    return network.LOOPBACK if local else address


def _worker_host(inventory, worker) -> WorkerHost:
    address = network.inventory_address(worker)
    try:
        served = hosts.resolve_host(worker.data, hosts.host_class_of(worker.groups),
                                         members(inventory, worker))
    except BadHostData as problem:  # refused on its own host too
        return WorkerHost(worker.name, address, problem=f"{worker.name}: {problem}")
    # A rank >= 1 of a node group serves only a dummy health server: the group is reached at its rank 0.
    return WorkerHost(worker.name, address, tuple(replica for d in served
                                                  if not (d.node_group and not d.node_group.serves_http)
                                                  for replica in d.replicas),
                      weights=tuple(d.weights for d in served))


def _gateway_host(gateway_host) -> GatewayHost:
    address = network.inventory_address(gateway_host)
    try:
        return GatewayHost(gateway_host.name, address, config.resolve(gateway_host.data))
    except BadHostData as error:
        return GatewayHost(gateway_host.name, address, None, f"{gateway_host.name}: {error}")


def resolve(inventory) -> Fleet:
    """Every worker host's replicas and every gateway host's gateway, each resolved once."""
    return Fleet(tuple(_worker_host(inventory, h) for h in inventory if roles.serves_model(h.groups)),
                 tuple(_gateway_host(h) for h in inventory if roles.is_gateway(h.groups)))


# Per run (pyinfra's state): the inventory's fleet. A deploy file runs once per host, and each asks the
# gateways of its replicas; resolving the inventory on every such question costs 8·N² host resolutions
# in a run over N hosts of 8 replicas.
_fleets: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def of(inventory) -> Fleet:
    """The run's fleet (pyinfra's inventory, whose data is fixed once the run starts), resolved on first use."""
    state = inventory.state
    if state not in _fleets:
        _fleets[state] = resolve(inventory)
    return _fleets[state]


def _worker_problem(worker_name: str, service: ServiceHost, address: str, local: bool) -> str | None:
    if local:
        return None
    if not network.ADDRESS.fullmatch(address):
        return f"{worker_name}: its address {address!r} is not a host name or IPv4 address"
    if not service.exposed:
        return (f"{worker_name} serves on {service.bind_address} only, which the gateway cannot reach: "
                f"deploy it with bind_address=0.0.0.0 and ${service.api_key_env} set")
    return None


def workers(fleet: Fleet, gateway_host, model: str) -> list[Worker]:
    """The fleet's workers of `model` as `gateway_host` reaches them: one per replica serving it, each
    at its URL (``worker_address``); a worker host whose data is refused is one worker with its problem."""
    found = []
    for worker in fleet.workers:
        if worker.problem:
            found.append(Worker(worker.name, "", worker.problem))
            continue
        local = same_host(worker, gateway_host)
        address = worker_address(local, worker.address)
        for replica in worker.servers:
            if replica.engine.served_model_name == model:
                found.append(Worker(worker.name, network.url(address, replica.port),
                                    _worker_problem(worker.name, replica.engine.service, address, local),
                                    replica.service_name))
    return found


def worker_addresses(fleet: Fleet, gateway_host) -> dict[str, str]:
    """Each worker host's address as `gateway_host` reaches its servers (``worker_address``)."""
    return {worker.name: worker_address(same_host(worker, gateway_host), worker.address) for worker in fleet.workers}


def gateways(fleet: Fleet, worker_host) -> list[Route]:
    """Every gateway of the fleet, of any model, for `worker_host`: where it reaches the worker, and
    where the worker reaches it as a client (on loopback when it is the same host, else at the gateway's
    bind address, its network address for 0.0.0.0; none for a gateway on another host's loopback)."""
    found = []
    for gateway_host in fleet.gateways:
        g = gateway_host.gateway
        if g is None:
            found.append(Route(gateway_host.name, None, "", problem=gateway_host.problem))
            continue
        local = same_host(gateway_host, worker_host)
        address = ""
        if local:
            address = g.local_address
        elif g.exposed:
            address = gateway_host.address if g.bind_address in network.WILDCARDS else g.bind_address
        found.append(Route(gateway_host.name, g, worker_address(local, network.inventory_address(worker_host)),
                           address if network.ADDRESS.fullmatch(address) else "", local=local,
                           gateway_address=gateway_host.address))
    return found


def _gateway_problem(route: Route, worker_name: str) -> str | None:
    """A gateway on another host reaches a replica only from an IP address its unit admits (IPAddressAllow=)."""
    if route.local:
        return None
    for what, address in (("address", route.gateway_address), ("API address", route.address)):
        if address and not network.is_ip(address):
            return (f"{route.gateway}: its {what} {address!r} is not an IP address, and {worker_name}'s servers "
                    f"admit their gateways by address (IPAddressAllow=): give {route.gateway} its IP address "
                    f"(gateway_worker_address)")
    return None


def addresses(routes: list[Route]) -> tuple[str, ...]:
    """What a replica's unit admits of its gateways on other hosts (sandbox.reached_from): each one's host
    address, where it connects to the replica from (and its Prometheus scrapes it), and its API's, where the
    bench's client on the replica's host reaches it."""
    return tuple(dict.fromkeys(address for r in routes if not r.local and r.control
                               for address in (r.gateway_address, r.address) if network.is_ip(address)))


def routes(fleet: Fleet, worker_host, server: Server) -> list[Route]:
    """The gateways routing `server`'s model (one replica's, on `worker_host`); a route carries the
    replica's own problem (a server the gateway cannot reach) too."""
    if not any(same_host(w, worker_host) and server.service_name in {s.service_name for s in w.servers}
               for w in fleet.workers):
        return []  # a rank >= 1 of a node group serves no model
    found = []
    for route in gateways(fleet, worker_host):
        if route.problem and not route.model:
            found.append(route)  # a gateway whose data is refused: every worker of it fails with that
        elif route.model == server.engine.served_model_name:
            problem = route.problem or _worker_problem(worker_host.name, server.engine.service, route.worker_address,
                                                       route.local) or _gateway_problem(route, worker_host.name)
            found.append(replace(route, problem=problem))
    return found
