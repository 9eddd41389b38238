"""The bench's side of a replica's gateways: each replica drained from them before its server stops (bench.py's
and tune.py's), and at execution time what a gateway lists now, and a replica registered again once its
deployed unit generates after the sweep (as a deploy's ``drain.rejoin`` does)."""

from pyinfra.api.operation import OperationMeta

from deployment.gateway import membership
from deployment.gateway.membership import Route
from deployment.server.config import Server
from operations.basics import shell
from operations.basics.units import any_change
from operations.gateway import drain, registry
from operations.server import readiness


def drained(inventory, host, replicas: tuple[Server, ...]) -> tuple[list[list[Route]], list[OperationMeta | None]]:
    """Per replica, its gateways (membership.routes) and the drain from them (None: in no gateway), for the
    sweep to register it again once its deployed unit generates (``back_in_gateways``), as a deploy's restart does."""
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


def back_in_gateways(host, back: list[tuple[Server, dict]],
                     rejoin: list[tuple[list[Route], OperationMeta | None]]) -> list[str]:
    """After ``units.restore`` (`back`: each deployed replica and its last probe): the replicas that generate
    again and were drained before the sweep (`rejoin`, from ``drained``) registered again with their gateways,
    as ``drain.rejoin`` does, but each gateway once for all of them: smg's success threshold is waited once,
    not once a replica. What failed, said in red: "restore" a replica that does not generate, "gateway"
    a gateway that did not register them."""
    failed, drained_back = [], []
    for (replica, probe), (routes, drained) in zip(back, rejoin):
        if not readiness.generates(probe):
            host.log_styled(f"the deployed {replica.service_name} does not generate again ({probe.get('error')}): "
                            "run the deploy to repair it", fg="red")
            failed.append("restore")
        elif drained is not None and any_change([drained]):
            drained_back.append((replica, routes))
    for route, command in drain.joins(drained_back):
        ok, output = shell.run_elsewhere(registry.gateway_host(route), command)
        if not ok:
            host.log_styled(f"{host.name}: registering its replicas again with {route.gateway} failed: "
                            f"{' '.join((output.stderr or output.stdout).split())[-300:]}", fg="red")
            failed.append("gateway")
    if drained_back and "gateway" not in failed:
        names = ", ".join(r.service_name for r, _ in drained_back)
        gateways = ", ".join(sorted({route.gateway for _, routes in drained_back for route in routes}))
        host.log_styled(f"{host.name}: {names} back in {'its' if len(drained_back) == 1 else 'their'} gateways "
                        f"({gateways})", fg="green")
    return failed
