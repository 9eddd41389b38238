"""smg's worker API, driven on the gateway's own host: its list of workers (`GatewayWorkers`), one worker's
registration or drain (host_scripts/gateway_workers.py), and the gateway's list kept equal to the
inventory's (`register_workers`).

The deploy knows which workers the gateway should route to from the inventory itself
(membership.workers). The gateway's own list (`GET /workers`, read as the `GatewayWorkers` fact) is
compared with it: a worker missing there is registered (`POST /workers`, then waited until `ready`), a
worker of that model that the inventory no longer has is removed (`DELETE /workers/{id}`), and when both
agree nothing is written to the gateway. A gateway routes its model alone: a worker of another model (left
by a host that serves another profile now) is removed. The gateway's control
plane takes its admin key (`gateway_admin_key_env`), which never leaves the gateway's host: every change
of its workers runs there, a worker's too. A worker that fails readiness is rolled back and stays out,
also through later runs that do not deploy it: the gateway's own stage registers only the workers it
listed before the run and those that generate in it (the gateway's list is the memory of who is out).
A worker the gateway lists as `failed` is removed and registered again by that stage
(gateway_workers.py `sync`).
"""

import json
import shlex
import time

from pyinfra import host, state
from pyinfra.api import FactBase, FunctionCommand, operation
from pyinfra.api.operation import OperationMeta

from deployment import network
from deployment.gateway.config import Gateway
from deployment.gateway.membership import Route, Worker
from operations.basics import outcomes, shell
from operations.basics.failing import fail_host
from operations.basics.host_programs import inline
from operations.basics.units import any_change
from operations.basics.untrusted import printable


class GatewayWorkers(FactBase):
    """
    The gateway's registered workers of one model and its /readiness (host_scripts/gateway_workers.py).

    .. code:: python

        {"reachable": True, "readiness": {"status": "ready", "healthy_workers": 2, "total_workers": 2},
         "workers": [{"id": "01a2...", "url": "http://10.213.1.10:30000", "status": "ready",
                      "model_id": "moonshotai/Kimi-K2.6"}],
         "others": [{"id": "77c1...", "url": "http://10.213.1.11:30000", "status": "ready",
                     "model_id": "qwen3.6-27b"}]}
    """

    def command(self, port: int, key_file: str, model: str, address: str = network.LOOPBACK,
                owner: str | None = None) -> str:
        # Inline: read the same way from the gateway host and from a worker's host, before any upload.
        return inline("gateway_workers", "--address", address, *(["--owner", owner] if owner else []),
                      str(port), key_file, model, "list")

    def process(self, output):
        try:
            return json.loads(output[-1])
        except (IndexError, ValueError):
            return {"reachable": False, "workers": [], "error": " ".join(output)[-200:]}


def gateway_host(route: Route):
    """The inventory host of `route`'s gateway, where its control plane is driven, connected (a rollout's
    gateway is outside --limit)."""
    return shell.connected(state.inventory.get_host(route.gateway))


def listing_args(g: Gateway, model: str) -> dict:
    """The ``GatewayWorkers`` fact's arguments on the gateway's own host: its API, its admin key file."""
    return dict(port=g.port, key_file=g.admin_key_file, model=model, address=g.local_address, owner=g.user)


def listing(route: Route, model: str) -> dict:
    """The route's gateway's workers of `model`, read on the gateway's host (the admin key stays there)."""
    return gateway_host(route).get_fact(GatewayWorkers, **listing_args(route.control, model))


def worker_command(route: Route, model: str, action: str, url: str, *extra: str) -> str:
    """gateway_workers.py `action` for one worker, as the gateway's host runs it: its own API, its admin key
    and the key it sends its workers (its clients', which the workers take), read there."""
    g = route.control
    return inline("gateway_workers", "--address", g.local_address, "--owner", g.user, "--worker-key-file", g.key_file,
                  str(g.port), g.admin_key_file, model, action, str(g.register_timeout_s), url, *extra)


def gateway_program(host, command: str, failed: str, on=None) -> dict | None:
    """gateway_workers.py run on the gateway's host `on` (this host when None): the JSON line it ends with,
    or None, said in red on this host after `failed`."""
    ok, output = shell.run_elsewhere(on, command) if on is not None else shell.run(host, command)
    if not ok:
        host.log_styled(f"{failed}: {printable(output.stderr or output.stdout)}", fg="red")
        return None
    return json.loads(output.stdout_lines[-1])


@operation()
def workers_done():
    """
    The point every host passes between the workers' stages and the gateway's: pyinfra orders
    operations by each host's own sequence, so without an operation that workers and gateway
    hosts share, a gateway-only host would register workers before they serve.

    **Example:**

    .. code:: python

        registry.workers_done(name="Workers done")
    """
    host.noop("the gateway stage starts after every worker's readiness")
    return
    yield  # an operation is a generator


def listed(gateway: Gateway) -> dict:
    """The gateway's workers of its model as the gateway host reads them (the `GatewayWorkers` fact)."""
    g = gateway
    return host.get_fact(GatewayWorkers, **listing_args(g, g.model))


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
def register_workers(gateway: Gateway, wanted: list[Worker], listing_before: dict, restarted: OperationMeta,
                     addresses: dict[str, str]):
    """
    Make the gateway's workers of its model the inventory's: register the missing ones (`POST /workers`,
    waited until `ready`) among those it routes to after this run (``kept_in``), remove those the
    inventory no longer has, and every worker of another model.

    Runs after every worker's readiness (deploy.py's last stage); a worker host that failed earlier in
    this run (rolled back to what it served before) has none of its workers registered or removed. With
    nothing to change, nothing is written.

    + gateway: the host's resolved gateway
    + wanted: the inventory's workers of the gateway's model (``membership.workers``)
    + listing_before: the gateway's workers before this run (``listed()``, read before its unit's
      operation: a restarted smg has forgotten them)
    + restarted: the gateway's unit operation
    + addresses: each worker host's address as the gateway reaches it (``membership.worker_addresses``)

    **Example:**

    .. code:: python

        registry.register_workers(name="Gateway workers", gateway=g, wanted=membership.workers(fleet, host, g.model),
                                  listing_before=listed(g), restarted=unit,
                                  addresses=membership.worker_addresses(fleet, host))
    """
    g = gateway
    problems = [w.problem for w in wanted if w.problem]
    if problems:
        yield fail_host(problems, static=True)  # the inventory's data: known before the run
        return
    if not any_change([restarted]):
        current = listed(g)
        registered = {w["url"]: w["status"] for w in current["workers"]}
        inventory = {w.url for w in wanted}
        if current["reachable"] and set(registered) <= inventory and not current.get("others") and all(
                registered.get(w.url) == "ready" for w in kept_in(listing_before, wanted, state)):
            outcomes.note(host, gateway_workers=len(registered))
            host.noop(f"the gateway routes {g.model} to {len(registered)} of its {len(wanted)} inventory workers, "
                      "all ready")
            return
    yield FunctionCommand(_sync_workers, (g, wanted, listing_before, addresses), {})


def _sync_workers(state, host, gateway: Gateway, wanted: list[Worker], listing_before: dict,
                  addresses: dict[str, str]) -> bool:
    """At execution time, after the workers' own stages (pyinfra passes `state` and `host` by these names)."""
    g = gateway
    register = [w.url for w in kept_in(listing_before, wanted, state)]
    failed = [addresses[h.name] for h in state.failed_hosts if h.name in addresses]
    command = " ".join(shlex.quote(part) for part in (
        "python3", g.script, "--address", g.local_address, "--owner", g.user, "--worker-key-file", g.key_file,
        str(g.port), g.admin_key_file, g.model, "sync", str(g.register_timeout_s),
        "--register", *register, "--inventory", *(w.url for w in wanted), "--alone",
        "--keep-address", *failed))
    started = time.monotonic()
    result = gateway_program(host, command, "gateway workers not converged")
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
