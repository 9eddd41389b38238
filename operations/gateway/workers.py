"""The gateway's workers: who they are (the inventory's hosts serving the gateway's model), a worker
draining itself before its server restarts and rejoining once it generates, and the gateway's list
kept equal to the inventory's (`register_workers`).

The deploy knows which workers the gateway should route to from the inventory itself (`workers()`).
The gateway's own list (`GET /workers`, read as the `GatewayWorkers` fact) is compared with it: a
worker missing there is registered (`POST /workers`, then waited until `ready`), a worker of that
model that the inventory no longer has is removed (`DELETE /workers/{id}`), and when both agree
nothing is written to the gateway. Workers of other models are left alone. The gateway's control
plane takes its admin key (`gateway_admin_key_env`), which never leaves the gateway's host: every
change of its workers runs there (host_scripts/gateway_workers.py), a worker's too.

A worker whose server is about to restart is drained first (`drain`, an operation of the worker's
host whose commands run on each of its gateways' hosts, over that host's own connection): the gateway
stops sending it requests, the drain waits until the server holds none in flight (its /metrics, read
from the gateway's host at the worker's URL; at most `longest_generation_s`), then systemd's SIGTERM
stops it. Once a server generates in a run, `rejoin` registers it again, from the gateway's host too.
A worker that fails readiness is rolled back and stays out, also through later runs that do not
deploy it: the gateway's own stage registers only the workers it listed before the run and those
that generate in it (the gateway's list is the memory of who is out). A worker the gateway lists as
`failed` is removed and registered again by that stage (gateway_workers.py `sync`).
"""

import json
import shlex
import time
from dataclasses import dataclass, replace

from pyinfra import host, state
from pyinfra.api import FactBase, FunctionCommand, QuoteString, StringCommand, operation
from pyinfra.api.operation import OperationMeta

from operations import deployment
from operations.basics import gathering, network, outcomes, shell
from operations.basics.failing import fail_host
from operations.basics.host_programs import inline
from operations.basics.knobs import BadHostData
from operations.basics.file_states import FileStates
from operations.basics.untrusted import printable
from operations.gateway import config
from operations.gateway.config import Gateway
from operations.nodes.group import members
from operations.server.config import Server
from operations.server.unit import Restart, ServerUnits, refusals

GROUP = "gateway"  # the inventory group of gateway hosts


def serves_model(groups) -> bool:
    """In a class group: an SGLang worker (a gateway-only host is in none and skips every GPU stage)."""
    return any(group in deployment.HOST_CLASSES for group in groups)


@dataclass(frozen=True)
class Worker:
    name: str  # the inventory host it runs on
    url: str  # as the gateway reaches it
    problem: str | None = None  # why it cannot be registered
    replica: str = ""  # its SGLang unit on that host (one worker per replica)


def worker_address(worker_host, gateway_host) -> str:
    """Where a gateway reaches the servers of `worker_host`: loopback on its own host, else the worker's
    `gateway_worker_address`, `ssh_hostname` or name (network.inventory_address)."""
    # pyinfra hands the deploy a proxy of its host: names, not identity.
    return "127.0.0.1" if worker_host.name == gateway_host.name else network.inventory_address(worker_host)


def worker_url(address: str, port: int) -> str:
    """A worker as a gateway registers it: one replica's server, at its host's address and its port."""
    return f"http://{address}:{port}"


def _worker_problem(worker_host, server: Server, address: str, same_host: bool) -> str | None:
    if same_host:
        return None
    if not network.ADDRESS.fullmatch(address):
        return f"{worker_host.name}: its address {address!r} is not a host name or IPv4 address"
    if not server.exposed:
        return (f"{worker_host.name} serves on {server.bind_address} only, which the gateway cannot reach: "
                f"deploy it with bind_address=0.0.0.0 and ${server.api_key_env} set")
    return None


def workers(inventory, gateway_host, model: str) -> list[Worker]:
    """The inventory's workers of `model`, one per replica serving it, each with its URL on the network
    the gateway reaches (``worker_address``, ``worker_url``)."""
    found = []
    for worker in inventory:
        if not serves_model(worker.groups):
            continue
        try:
            served = deployment.resolve_host(worker.data, deployment.host_class_of(worker.groups),
                                             members(inventory, worker))
        except BadHostData as problem:  # refused on its own host too
            found.append(Worker(worker.name, "", f"{worker.name}: {problem}"))
            continue
        address = worker_address(worker, gateway_host)
        for d in served:
            if d.server.served_model_name != model or (d.node_group and not d.node_group.serves_http):
                continue  # a rank >= 1 of a node group serves no HTTP: the group is reached at its rank 0
            for replica in d.replicas:
                found.append(Worker(worker.name, worker_url(address, replica.port),
                                    _worker_problem(worker, replica, address, worker.name == gateway_host.name),
                                    replica.service_name))
    return found


@dataclass(frozen=True)
class Route:
    """One gateway of a worker's host: its control plane, driven on the gateway's own host (to drain and
    rejoin the worker's replicas), and its API as the worker's host reaches it as a client (the bench)."""

    gateway: str  # the gateway host's name: where its workers are changed, with its admin key
    control: Gateway | None  # the gateway as resolved from its host's data (None: refused, see problem)
    worker_address: str  # where that gateway reaches the worker's host (``worker_address``)
    address: str = ""  # where the worker's host reaches the gateway's API; "" when it cannot (loopback elsewhere)
    problem: str | None = None

    @property
    def model(self) -> str:
        return self.control.model if self.control else ""

    @property
    def port(self) -> int:
        return self.control.port

    def worker_url(self, port: int) -> str:
        return worker_url(self.worker_address, port)


def gateways(inventory, worker_host) -> list[Route]:
    """Every gateway of the inventory, of any model, for `worker_host`: where it reaches the worker, and
    where the worker reaches it as a client (on loopback when it is the same host, else at the gateway's
    bind address, its network address for 0.0.0.0; none for a gateway on another host's loopback)."""
    found = []
    for gateway_host in inventory:
        if GROUP not in gateway_host.groups:
            continue
        try:
            g = config.resolve(gateway_host.data)
        except BadHostData as error:
            found.append(Route(gateway_host.name, None, "", problem=f"{gateway_host.name}: {error}"))
            continue
        address = ""
        if gateway_host.name == worker_host.name:
            address = g.local_address
        elif g.exposed:
            address = network.inventory_address(gateway_host) if g.bind_address in network.WILDCARDS else g.bind_address
        found.append(Route(gateway_host.name, g, worker_address(worker_host, gateway_host),
                           address if network.ADDRESS.fullmatch(address) else ""))
    return found


def routes(inventory, worker_host, server: Server) -> list[Route]:
    """The gateways routing `server`'s model (one replica's, on `worker_host`); a route carries the
    replica's own problem (a server the gateway cannot reach) too."""
    if not any(w.name == worker_host.name and w.replica == server.service_name
               for w in workers(inventory, worker_host, server.served_model_name)):
        return []  # a rank >= 1 of a node group serves no HTTP
    found = []
    for route in gateways(inventory, worker_host):
        if route.problem and not route.model:
            found.append(route)  # a gateway whose data is refused: every worker of it fails with that
        elif route.model == server.served_model_name:
            problem = route.problem or _worker_problem(worker_host, server, route.worker_address,
                                                       route.gateway == worker_host.name)
            found.append(replace(route, problem=problem))
    return found


def gateway_host(route: Route):
    """The inventory host of `route`'s gateway, where its control plane is driven (pyinfra connects a host
    outside --limit, such as a rollout's gateway, when its first fact is read)."""
    return state.inventory.get_host(route.gateway)


def _listing_args(g: Gateway, model: str) -> dict:
    """The ``GatewayWorkers`` fact's arguments on the gateway's own host: its API, its admin key file."""
    return dict(port=g.port, key_file=g.admin_key_file, model=model, address=g.local_address, owner=g.user)


def _listing(route: Route, model: str) -> dict:
    """The route's gateway's workers of `model`, read on the gateway's host (the admin key stays there)."""
    return gateway_host(route).get_fact(GatewayWorkers, **_listing_args(route.control, model))


def listing_now(host, route: Route, model: str) -> dict:
    """At execution time (bench.py's sweep): the route's gateway's workers of `model`, read now on the
    gateway's host as `_listing` reads them before the run (the ``GatewayWorkers`` fact's program)."""
    fact = GatewayWorkers()
    _, output = shell.run_elsewhere(gateway_host(route), fact.command(**_listing_args(route.control, model)))
    return fact.process(output.stdout_lines)


def _worker_command(route: Route, model: str, action: str, url: str, *extra: str) -> str:
    """gateway_workers.py `action` for one worker, as the gateway's host runs it: its own API, its admin key
    and the key it sends its workers (its clients', which the workers take), read there."""
    g = route.control
    return inline("gateway_workers", "--address", g.local_address, "--owner", g.user, "--worker-key-file", g.key_file,
                  str(g.port), g.admin_key_file, model, action, str(g.register_timeout_s), url, *extra)


# Where workers held their gateways' admin key while they drained themselves (root's, in config_dir).
LEGACY_ADMIN_KEY = "gateway-admin-key"


def _legacy_admin_key(server: Server) -> str:
    return f"{server.config_dir}/{LEGACY_ADMIN_KEY}"


@gathering.wants
def _read(deployment, snapshots) -> gathering.Wanted:
    return [(FileStates, dict(paths=(_legacy_admin_key(deployment.server),)))]


@operation()
def no_admin_key(server: Server):
    """
    No gateway's admin key on a worker's host: its gateways' hosts drive its drain and registration
    (``drain``, ``rejoin``), so a key a worker held for them (`config_dir`/gateway-admin-key) is removed.

    + server: any replica of the host (its configuration directory)

    **Example:**

    .. code:: python

        workers.no_admin_key(name="No gateway admin key on the worker", server=replica)
    """
    path = _legacy_admin_key(server)
    own = config.resolve(host.data).admin_key_file if GROUP in host.groups else None
    if path != own and gathering.read(FileStates, paths=(path,)).get(path):
        yield StringCommand("rm", "-f", QuoteString(path))
    else:
        host.noop("no gateway's admin key on this worker")


@operation()
def drain(server: Server, routes: list[Route], restart: Restart | None):
    """
    Take this replica out of its gateways before its server restarts, from each gateway's own host (with
    its admin key, which stays there): `DELETE /workers/{id}` (no new requests), waited until each gateway
    lets it go; then wait until the server holds no request in flight (its /metrics, read at the URL the
    gateway reaches it at, three times in a row; at most `longest_generation_s`). smg
    lets a worker go after a fixed settle time, whatever it still generates; the restart that
    follows is systemd's SIGTERM to the server's main process, which finishes what is left. The
    host's other replicas keep serving meanwhile (deploy.py rolls them one at a time).

    + server: the replica's server
    + routes: its gateways (`routes()`)
    + restart: this run's restart decision of the replica (``server.unit.Restart``), which the unit's
      operation after the drain takes too; None where the caller stops the server whatever (bench.py)

    **Example:**

    .. code:: python

        workers.drain(name="Drain from the gateway", server=replica, routes=routes(inventory, host, replica),
                      restart=restart)
    """
    d = server
    problems = [route.problem for route in routes if route.problem]
    if not d.enable_metrics:
        problems.append(f"{host.name} serves behind a gateway without /metrics, where its drain reads the "
                        "requests in flight: keep enable_metrics=true")
    if restart is not None and not restart.decision().restarts:
        host.noop(f"{d.service_name} does not restart: it stays in its gateways")
        return
    if problems:
        yield fail_host(problems, static=True)  # the inventory's addresses and data: known before the run
        return
    listed = [route for route in routes if any(w["url"] == route.worker_url(d.port)
                                               for w in _listing(route, d.served_model_name)["workers"])]
    if not listed:
        host.noop(f"no gateway lists {d.service_name}: nothing to drain")
    for route in listed:
        # The last gateway's drain waits for the server to go idle: every gateway has stopped sending by then.
        idle = ("--idle", route.worker_url(d.port), str(d.longest_generation_s)) if route is listed[-1] else ()
        command = _worker_command(route, d.served_model_name, "drain", route.worker_url(d.port), *idle)
        yield FunctionCommand(_drain, (command, route.gateway), {})


def _gateway_program(host, command: str, failed: str, on=None) -> dict | None:
    """gateway_workers.py run on the gateway's host `on` (this host when None): the JSON line it ends with,
    or None, said in red on this host after `failed`."""
    ok, output = shell.run_elsewhere(on, command) if on is not None else shell.run(host, command)
    if not ok:
        host.log_styled(f"{failed}: {printable(output.stderr or output.stdout)}", fg="red")
        return None
    return json.loads(output.stdout_lines[-1])


def _drain(state, host, command: str, gateway: str) -> bool:  # pyinfra passes state and host by these names
    started = time.monotonic()
    result = _gateway_program(host, command, f"drain from {gateway} failed", state.inventory.get_host(gateway))
    if result is None:
        return False
    idle = ""
    if "in_flight" in result:
        idle = (f"; the server went idle after {result['idle_s']} s" if result["in_flight"] == 0 else
                f"; still {result['in_flight']} requests in flight after {result['idle_s']} s: the stop lets "
                "SGLang finish them")
    host.log_styled(f"drained from {gateway} ({time.monotonic() - started:.1f} s){idle}", fg="green")
    return True


@operation()
def rejoin(server: Server, routes: list[Route]):
    """
    Once the replica generates in this run (the readiness operation before it passed), register it
    with every gateway of its model that answers and lacks it (`POST /workers`, waited until `ready`):
    again after its drain, for the first time as a new replica, or back after a rollback kept it out;
    a gateway that does not answer registers it in its own stage. A replica that failed readiness
    never gets here and stays out.

    + server: the replica's server
    + routes: its gateways (`routes()`), whose hosts register it

    **Example:**

    .. code:: python

        workers.rejoin(name="Back in the gateway", server=replica, routes=routes)
    """
    joins = _joins(server, routes)
    if not joins:
        host.noop(f"every answering gateway lists {server.service_name}")
    for route, command in joins:
        yield FunctionCommand(_join, (command, route.gateway, server.service_name), {})


def _join(state, host, command: str, gateway: str, unit: str) -> bool:  # pyinfra passes state and host by these names
    started = time.monotonic()
    if _gateway_program(host, command, f"registering {unit} with {gateway} failed",
                        state.inventory.get_host(gateway)) is None:
        return False
    host.log_styled(f"{unit} registered with {gateway} ({time.monotonic() - started:.1f} s)", fg="green")
    return True


def _joins(server: Server, routes: list[Route]) -> list[tuple[Route, str]]:
    """Per gateway of this replica that answers and does not list it: the command registering it there,
    which runs on the gateway's host."""
    d, joins = server, []
    for route in routes:
        listing = _listing(route, d.served_model_name)
        if listing["reachable"] and all(w["url"] != route.worker_url(d.port) for w in listing["workers"]):
            joins.append((route, _worker_command(route, d.served_model_name, "join", route.worker_url(d.port))))
    return joins


def join_again(host, server: Server, routes: list[Route], drained: OperationMeta | None) -> bool:
    """At execution time, once a server stopped after `drained` (bench.py's sweep) generates again: register
    the replica again with its gateways, as ``rejoin`` does. False, saying why, when a join failed."""
    if drained is None or not drained.changed:
        return True
    for route, command in _joins(server, routes):
        ok, output = shell.run_elsewhere(gateway_host(route), command)
        if not ok:
            host.log_styled(f"{host.name}: registering {server.service_name} again with its gateway failed: "
                            f"{' '.join((output.stderr or output.stdout).split())[-300:]}", fg="red")
            return False
    host.log_styled(f"{host.name}: {server.service_name} back in its gateways ({', '.join(r.gateway for r in routes)})",
                    fg="green")
    return True


@operation()
def drain_retired(server: Server, gateways: list[Route], restarts: list[Restart]):
    """
    Take the SGLang units no deployment of this host wants any more (the single unit of an earlier
    layout, replicas of another layout or profile) out of every gateway that lists them, before
    ``unit.retired`` stops them: their port and model are read from their own unit files. Nothing
    leaves a gateway while the host's SGLang refuses a wanted replica's new files (``unit.retired``
    then fails the host, changing nothing).

    + server: any replica of the host (its unit prefix, its longest generation)
    + gateways: every gateway of the inventory (``gateways()``)
    + restarts: every wanted replica's restart decision (``server.unit.Restart``)

    **Example:**

    .. code:: python

        workers.drain_retired(name="Drain retired units", server=replica, gateways=gateways(inventory, host),
                              restarts=[Restart(replica, inputs, [key])])
    """
    d = server
    if refusals(restarts):
        host.noop("the host's SGLang refuses a new unit: nothing is retired")
        return
    wanted = {r.server.service_name for r in restarts}
    retired = {name: unit for name, unit in (gathering.read(ServerUnits, prefix=d.service_prefix) or {}).items()
               if name not in wanted and unit["port"] and unit["model"]}
    reachable = [route for route in gateways if not route.problem]
    drained = set()  # (gateway, model, url): units of one port are one worker to a gateway
    for name, unit in sorted(retired.items()):
        for route in reachable:
            url = route.worker_url(unit["port"])
            if (route.gateway, unit["model"], url) in drained:
                continue
            if any(w["url"] == url for w in _listing(route, unit["model"])["workers"]):
                drained.add((route.gateway, unit["model"], url))
                # Its requests in flight finish before unit.retired stops it, as a drained replica's do.
                command = _worker_command(route, unit["model"], "drain", url, "--idle", url, str(d.longest_generation_s))
                yield FunctionCommand(_drain, (command, route.gateway), {})
    if not drained:
        host.noop(f"no gateway lists a unit to retire ({', '.join(sorted(retired)) or 'none'})")


@operation()
def workers_done():
    """
    The point every host passes between the workers' stages and the gateway's: pyinfra orders
    operations by each host's own sequence, so without an operation that workers and gateway
    hosts share, a gateway-only host would register workers before they serve.

    **Example:**

    .. code:: python

        workers.workers_done(name="Workers done")
    """
    host.noop("the gateway stage starts after every worker's readiness")
    return
    yield  # an operation is a generator


class GatewayWorkers(FactBase):
    """
    The gateway's registered workers of one model and its /readiness (host_scripts/gateway_workers.py).

    .. code:: python

        {"reachable": True, "readiness": {"status": "ready", "healthy_workers": 2, "total_workers": 2},
         "workers": [{"id": "01a2...", "url": "http://10.213.1.10:30000", "status": "ready",
                      "model_id": "moonshotai/Kimi-K2.6"}]}
    """

    def command(self, port: int, key_file: str, model: str, address: str = "127.0.0.1", owner: str | None = None) -> str:
        # Inline: read the same way from the gateway host and from a worker's host, before any upload.
        return inline("gateway_workers", "--address", address, *(["--owner", owner] if owner else []),
                      str(port), key_file, model, "list")

    def process(self, output):
        try:
            return json.loads(output[-1])
        except (IndexError, ValueError):
            return {"reachable": False, "workers": [], "error": " ".join(output)[-200:]}


def listed(gateway: Gateway) -> dict:
    """The gateway's workers of its model as the gateway host reads them (the `GatewayWorkers` fact)."""
    g = gateway
    return host.get_fact(GatewayWorkers, **_listing_args(g, g.model))


def kept_in(listing_before: dict, wanted: list[Worker], state) -> list[Worker]:
    """The inventory workers the gateway routes to after this run: those that did not fail in it and
    either were deployed in it or were listed before it. A worker kept out (rolled back after failing
    readiness) is in the list before no run, so only a run that deploys it brings it back. A gateway
    that did not answer before the run remembers nobody: every worker that did not fail is registered."""
    failed = {h.name for h in state.failed_hosts}
    if not listing_before.get("reachable"):
        return [w for w in wanted if w.name not in failed]
    before = {w["url"] for w in listing_before["workers"]}
    deployed = {h.name for h in state.inventory if state.is_host_in_limit(h)}
    return [w for w in wanted if w.name not in failed and (w.name in deployed or w.url in before)]


@operation()
def register_workers(gateway: Gateway, wanted: list[Worker], listing_before: dict, restarted: OperationMeta):
    """
    Make the gateway's workers of its model the inventory's: register the missing ones (`POST /workers`,
    waited until `ready`) among those it routes to after this run (``kept_in``), remove those the
    inventory no longer has.

    Runs after every worker's readiness (deploy.py's last stage); a worker that failed earlier
    in this run is neither registered nor removed. With nothing to change, nothing is written.

    + gateway: the host's resolved gateway
    + wanted: the inventory's workers of the gateway's model (`workers()`)
    + listing_before: the gateway's workers before this run (``listed()``, read before its unit's
      operation: a restarted smg has forgotten them)
    + restarted: the gateway's unit operation

    **Example:**

    .. code:: python

        workers.register_workers(name="Gateway workers", gateway=g, wanted=workers(inventory, host, g.model),
                                 listing_before=listed(g), restarted=unit)
    """
    g = gateway
    problems = [w.problem for w in wanted if w.problem]
    if problems:
        yield fail_host(problems, static=True)  # the inventory's data: known before the run
        return
    if not restarted.changed:
        current = listed(g)
        registered = {w["url"]: w["status"] for w in current["workers"]}
        inventory = {w.url for w in wanted}
        if current["reachable"] and set(registered) <= inventory and all(
                registered.get(w.url) == "ready" for w in kept_in(listing_before, wanted, state)):
            outcomes.note(host, gateway_workers=len(registered))
            host.noop(f"the gateway routes {g.model} to {len(registered)} of its {len(wanted)} inventory workers, "
                      "all ready")
            return
    yield FunctionCommand(_sync_workers, (g, wanted, listing_before), {})


def _sync_workers(state, host, gateway: Gateway, wanted: list[Worker], listing_before: dict) -> bool:
    """At execution time, after the workers' own stages (pyinfra passes `state` and `host` by these names)."""
    g = gateway
    register = [w.url for w in kept_in(listing_before, wanted, state)]
    command = " ".join(shlex.quote(part) for part in (
        "python3", g.script, "--address", g.local_address, "--owner", g.user, "--worker-key-file", g.key_file,
        str(g.port), g.admin_key_file, g.model, "sync", str(g.register_timeout_s),
        "--register", *register, "--inventory", *(w.url for w in wanted)))
    started = time.monotonic()
    result = _gateway_program(host, command, "gateway workers not converged")
    if result is None:
        return False
    outcomes.note(host, gateway_workers=len(register))
    out = sorted({w.url for w in wanted} - set(register))
    host.log_styled(f"gateway {g.model}: registered {result['added'] or 'none'}, "
                    f"removed {result['removed'] or 'none'}"
                    + (f" (failed there, registered again: {result['again']})" if result["again"] else "")
                    + f"; {len(register)} workers ready"
                    + (f"; kept out until a run deploys them: {out}" if out else "")
                    + f" ({time.monotonic() - started:.1f} s)", fg="green")
    return True
