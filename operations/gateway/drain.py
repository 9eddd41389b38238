"""A worker's replica leaving its gateways before its server restarts and rejoining once it generates,
each step run on the gateway's own host (smg's worker API, operations/gateway/registry.py).

A replica whose server is about to restart is drained first (`drain`, an operation of the worker's host
whose commands run on each of its gateways' hosts, over that host's own connection): the gateway stops
sending it requests, the drain waits until the server holds none in flight (its /metrics, read from the
gateway's host at the worker's URL; at most `longest_generation_s`), then systemd's SIGTERM stops it.
Once a server generates in a run, `rejoin` registers it again, from the gateway's host too. Units no
deployment wants any more leave their gateways the same way before they stop (`drain_retired`).
"""

import time

from pyinfra import host
from pyinfra.api import FunctionCommand, QuoteString, StringCommand, operation

from deployment import roles
from deployment.gateway import config
from deployment.gateway.membership import Route
from deployment.server.config import Server, ServiceHost
from operations.basics import gathering
from operations.basics.failing import fail_host
from operations.basics.file_states import FileStates
from operations.gateway import registry
from operations.server.unit import Replacement, Restart, refusals

# Where workers held their gateways' admin key while they drained themselves (root's, in config_dir).
LEGACY_ADMIN_KEY = "gateway-admin-key"


def _legacy_admin_key(service: ServiceHost) -> str:
    return f"{service.config_dir}/{LEGACY_ADMIN_KEY}"


@gathering.wants
def _read(deployment) -> gathering.Wanted:
    return [(FileStates, dict(paths=(_legacy_admin_key(deployment.engine.service),)))]


@operation()
def no_admin_key(service: ServiceHost):
    """
    No gateway's admin key on a worker's host: its gateways' hosts drive its drain and registration
    (``drain``, ``rejoin``), so a key a worker held for them (`config_dir`/gateway-admin-key) is removed.

    + service: the host's servers' users and paths (its configuration directory)

    **Example:**

    .. code:: python

        drain.no_admin_key(name="No gateway admin key on the worker", service=worker.service)
    """
    path = _legacy_admin_key(service)
    own = config.resolve(host.data).admin_key_file if roles.is_gateway(host.groups) else None
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
    + routes: its gateways (``membership.routes``)
    + restart: this run's restart decision of the replica (``server.unit.Restart``), which the unit's
      operation after the drain takes too; None where the caller stops the server whatever (bench.py)

    **Example:**

    .. code:: python

        drain.drain(name="Drain from the gateway", server=replica, routes=membership.routes(fleet, host, replica),
                    restart=restart)
    """
    d = server
    problems = [route.problem for route in routes if route.problem]
    if not d.engine.service.enable_metrics:
        problems.append(f"{host.name} serves behind a gateway without /metrics, where its drain reads the "
                        "requests in flight: keep enable_metrics=true")
    if restart is not None and not restart.decision().restarts:
        host.noop(f"{d.service_name} does not restart: it stays in its gateways")
        return
    if problems:
        yield fail_host(problems, static=True)  # the inventory's addresses and data: known before the run
        return
    listed = [route for route in routes if any(w["url"] == route.worker_url(d.port)
                                               for w in registry.listing(route, d.engine.served_model_name)["workers"])]
    if not listed:
        host.noop(f"no gateway lists {d.service_name}: nothing to drain")
    for route in listed:
        # The last gateway's drain waits for the server to go idle: every gateway has stopped sending by then.
        idle = ("--idle", route.worker_url(d.port), str(d.engine.service.longest_generation_s)) \
            if route is listed[-1] else ()
        command = registry.worker_command(route, d.engine.served_model_name, "drain", route.worker_url(d.port), *idle)
        yield FunctionCommand(_drain, (command, route.gateway), {})


def _drain(state, host, command: str, gateway: str) -> bool:  # pyinfra passes state and host by these names
    started = time.monotonic()
    result = registry.gateway_program(host, command, f"drain from {gateway} failed", state.inventory.get_host(gateway))
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
    + routes: its gateways (``membership.routes``), whose hosts register it

    **Example:**

    .. code:: python

        drain.rejoin(name="Back in the gateway", server=replica, routes=routes)
    """
    commands = joins([(server, routes)])
    if not commands:
        host.noop(f"every answering gateway lists {server.service_name}")
    for route, command in commands:
        yield FunctionCommand(_join, (command, route.gateway, server.service_name), {})


def _join(state, host, command: str, gateway: str, unit: str) -> bool:  # pyinfra passes state and host by these names
    started = time.monotonic()
    if registry.gateway_program(host, command, f"registering {unit} with {gateway} failed",
                                state.inventory.get_host(gateway)) is None:
        return False
    host.log_styled(f"{unit} registered with {gateway} ({time.monotonic() - started:.1f} s)", fg="green")
    return True


def joins(replicas: list[tuple[Server, list[Route]]]) -> list[tuple[Route, str]]:
    """Per gateway that answers and model: the one command registering every replica of `replicas` (each with
    its gateways) that the gateway does not list, which runs on the gateway's host and waits for them all at
    once (smg's success threshold is a wait a command, not a replica's). Each gateway's listing of a model
    is read once, on the gateway's host, however many replicas ask."""
    listings: dict[tuple[str, str], dict] = {}
    missing: dict[tuple[str, str], tuple[Route, list[str]]] = {}
    for server, routes in replicas:
        model = server.engine.served_model_name
        for route in routes:
            if (route.gateway, model) not in listings:
                listings[route.gateway, model] = registry.listing(route, model)
            listing, url = listings[route.gateway, model], route.worker_url(server.port)
            if listing["reachable"] and all(w["url"] != url for w in listing["workers"]):
                missing.setdefault((route.gateway, model), (route, []))[1].append(url)
    return [(route, registry.worker_command(route, model, "join", *urls))
            for (_, model), (route, urls) in missing.items()]


@operation()
def drain_retired(replacement: Replacement, gateways: list[Route]):
    """
    Take the SGLang units the host's change replaces (``unit.Replacement``: the single unit of an earlier
    layout, replicas of another layout or profile) out of every gateway that lists them, before
    ``unit.retired`` stops them: their port and model are read from their own unit files. Should the change
    fail, they go back into the gateways they left here once they generate again (``Replacement.on_restored``).
    Nothing leaves a gateway while the host's SGLang refuses a wanted replica's new files (``unit.retired``
    then fails the host, changing nothing).

    + replacement: the host's change of units (``unit.Replacement``)
    + gateways: every gateway of the inventory (``membership.gateways``)

    **Example:**

    .. code:: python

        drain.drain_retired(name="Drain retired units", replacement=unit.Replacement(worker.service, restarts),
                            gateways=membership.gateways(fleet, host))
    """
    if refusals(replacement.restarts):
        host.noop("the host's SGLang refuses a new unit: nothing is retired")
        return
    retired = {name: unit for name, unit in replacement.replaced().items() if unit["port"] and unit["model"]}
    reachable = [route for route in gateways if not route.problem]
    drained: dict[tuple[str, str], tuple[Route, list[str]]] = {}  # (gateway, model): units of one port are one worker
    for name, unit in retired.items():
        for route in reachable:
            url, key = route.worker_url(unit["port"]), (route.gateway, unit["model"])
            if key in drained and url in drained[key][1]:
                continue
            if any(w["url"] == url for w in registry.listing(route, unit["model"])["workers"]):
                drained.setdefault(key, (route, []))[1].append(url)
                # Its requests in flight finish before unit.retired stops it, as a drained replica's do.
                command = registry.worker_command(route, unit["model"], "drain", url, "--idle", url,
                                                  str(replacement.service.longest_generation_s))
                yield FunctionCommand(_drain, (command, route.gateway), {})
    if not drained:
        host.noop(f"no gateway lists a unit to retire ({', '.join(sorted(retired)) or 'none'})")
        return
    rejoins = [(route, registry.worker_command(route, model, "join", *urls)) for (_, model), (route, urls) in drained.items()]
    replacement.on_restored.append(lambda state, host: _rejoined(state, host, rejoins))


def _rejoined(state, host, rejoins: list[tuple[Route, str]]) -> str:
    """The restored units registered again with each gateway they left: what happened, said."""
    back = [route.gateway for route, command in rejoins
            if registry.gateway_program(host, command, f"registering the restored units with {route.gateway} failed",
                                        state.inventory.get_host(route.gateway)) is not None]
    failed = sorted({route.gateway for route, _ in rejoins} - set(back))
    return (f"back in {', '.join(back)}" if back else "") + (f"; not back in {', '.join(failed)}" if failed else "")
