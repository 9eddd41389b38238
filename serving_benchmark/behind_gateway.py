"""The bench's side of a replica's gateways: each replica drained from them before its server stops (bench.py's
and tune.py's), and at execution time what a gateway lists now, and a replica registered again once its
deployed unit generates after the sweep (as a deploy's ``drain.rejoin`` does)."""

from pyinfra.api.operation import OperationMeta

from operations.basics import shell
from operations.basics.units import any_change
from operations.gateway import drain, membership, registry
from operations.gateway.membership import Route
from operations.server.config import Server


def drained(inventory, host, replicas: tuple[Server, ...]) -> tuple[list[list[Route]], list[OperationMeta | None]]:
    """Per replica, its gateways (membership.routes) and the drain from them (None: in no gateway), for the
    sweep to register it again once its deployed unit generates (``join_again``), as a deploy's restart does."""
    routes, drains, fleet = [], [], membership.of(inventory)
    for replica in host.loop(replicas):
        routes.append(membership.routes(fleet, host, replica))
        drains.append(drain.drain(name=f"Drain {replica.service_name} from the gateway", server=replica,
                                  routes=routes[-1], restart=None) if routes[-1] else None)
    return routes, drains


def listing_now(host, route: Route, model: str) -> dict:
    """The route's gateway's workers of `model`, read now on the gateway's host as ``registry.listing``
    reads them before the run (the ``GatewayWorkers`` fact's program)."""
    fact = registry.GatewayWorkers()
    _, output = shell.run_elsewhere(registry.gateway_host(route),
                                    fact.command(**registry.listing_args(route.control, model)))
    return fact.process(output.stdout_lines)


def join_again(host, server: Server, routes: list[Route], drained: OperationMeta | None) -> bool:
    """Once a server stopped after `drained` generates again: register the replica again with its
    gateways, as ``drain.rejoin`` does. False, saying why, when a join failed."""
    if drained is None or not any_change([drained]):
        return True
    for route, command in drain.joins(server, routes):
        ok, output = shell.run_elsewhere(registry.gateway_host(route), command)
        if not ok:
            host.log_styled(f"{host.name}: registering {server.service_name} again with its gateway failed: "
                            f"{' '.join((output.stderr or output.stdout).split())[-300:]}", fg="red")
            return False
    host.log_styled(f"{host.name}: {server.service_name} back in its gateways ({', '.join(r.gateway for r in routes)})",
                    fg="green")
    return True
