"""SGLang's model gateway (smg) on the `gateway` group's hosts, with the inventory's workers registered.

The deploy knows which workers the gateway should route to from the inventory itself: every
host in a class group whose profile serves the gateway's model (`workers()`). The gateway's
own list (`GET /workers`, read as the `GatewayWorkers` fact) is compared with it: a worker
missing there is registered (`POST /workers`, then waited until `ready`), a worker of that
model that the inventory no longer has is removed (`DELETE /workers/{id}`), and when both
agree nothing is written to the gateway. Workers of other models are left alone.

A worker whose server is about to restart drains itself first (`drain`, on the worker host,
talking to each of its gateways at the address `routes()` derives from the inventory): the
gateway stops sending it requests, systemd's SIGTERM lets the server finish those in flight,
and once the new server generates, `rejoin` registers it again. A worker that fails readiness
is rolled back by readiness.py and stays out; rollout.py runs the fleet N workers at a time.
"""

import json
import os
import posixpath
import re
import shlex
import time
from dataclasses import dataclass
from io import StringIO
from pathlib import Path
from typing import Any

from pyinfra import host
from pyinfra.api import FactBase, FunctionCommand, operation
from pyinfra.api.operation import OperationMeta
from pyinfra.operations import files, systemd

from operations.basics import knobs
from operations.server import unit
from operations.deployment.config import HOST_CLASSES, Deployment, host_class_of, resolve, served_model_name
from operations.basics.failing import fail_host
from operations.nodes.group import members
from operations.basics.file_states import FileStates, matches, sha1_of
from operations.basics.host_programs import inline
from operations.basics.knobs import BadHostData
from operations.basics.secrets import controller_key_file
from operations.basics.units import ServiceState
from operations.basics.templates import render

GROUP = "gateway"
ADDRESS = re.compile(r"^[A-Za-z0-9][A-Za-z0-9.-]*$")  # a host name or IPv4 address, nothing a shell reads
POLICY = re.compile(r"^[a-z_]+$")
ENDPOINT = re.compile(r"^/[A-Za-z0-9_./-]*$")
HEALTH_KEYS = ("endpoint", "interval_secs", "timeout_secs", "failure_threshold", "success_threshold")
LOOPBACK = ("127.0.0.1", "localhost", "::1")


@dataclass(frozen=True)
class Gateway:
    """What one gateway host runs (group_data/gateway.py), resolved and validated."""

    model: str  # the served model name of the host's profile: its workers serve the same
    requirement: str
    service_name: str
    user: str
    bind_address: str
    port: int
    prometheus_port: int
    policy: str
    health: dict[str, Any]
    register_timeout_s: int
    install_dir: str
    config_dir: str
    pip_index_url: str | None
    api_key_env: str
    remove_api_key: bool  # only this removes the gateway's key (as the workers', `remove_api_key`)

    @property
    def venv(self) -> str:
        return f"{self.install_dir}/smg-venv"

    @property
    def home(self) -> str:
        return f"/var/lib/{self.service_name}"

    @property
    def key_file(self) -> str:
        return f"{self.config_dir}/{self.service_name}-api-key"

    @property
    def unit_file(self) -> str:
        return f"/etc/systemd/system/{self.service_name}.service"

    @property
    def script(self) -> str:
        return f"{self.install_dir}/bin/gateway_workers.py"

    @property
    def exposed(self) -> bool:
        return self.bind_address not in LOOPBACK

    def args(self) -> list[str]:
        """smg launch's arguments (the API key is added on the host by launch_smg.py)."""
        h = self.health
        return ["--host", self.bind_address, "--port", str(self.port), "--policy", self.policy,
                "--prometheus-host", self.bind_address, "--prometheus-port", str(self.prometheus_port),
                "--health-check-endpoint", h["endpoint"],
                "--health-check-interval-secs", str(h["interval_secs"]),
                "--health-check-timeout-secs", str(h["timeout_secs"]),
                "--health-failure-threshold", str(h["failure_threshold"]),
                "--health-success-threshold", str(h["success_threshold"]),
                "--worker-startup-timeout-secs", str(self.register_timeout_s)]


def resolve_gateway(data: Any) -> Gateway:
    """A gateway host's data as the typed, validated `Gateway` (every value reaches a unit file or a
    shell line); a bad value raises BadHostData naming the knob, the value and what is accepted."""
    health = data.gateway_health
    if not isinstance(health, dict) or set(health) != set(HEALTH_KEYS):
        raise BadHostData(f"gateway_health={health!r} is not accepted: use dict({', '.join(HEALTH_KEYS)})")

    def port(name: str) -> int:
        return knobs.integer(name, getattr(data, name), minimum=1, maximum=65535)

    return Gateway(
        model=served_model_name(data),
        requirement=knobs.matching("gateway_requirement", data.gateway_requirement, knobs.REQUIREMENT,
                                   "a pip requirement on one line (e.g. smg==1.13.0)"),
        service_name=knobs.matching("gateway_service_name", data.gateway_service_name, knobs.UNIT_NAME,
                                    "a unit name (letters, digits, _.-)"),
        user=knobs.matching("gateway_user", data.gateway_user, knobs.USER_NAME,
                            "a user name ([a-z_][a-z0-9_-], at most 32)"),
        bind_address=knobs.matching("gateway_bind_address", data.gateway_bind_address, ADDRESS,
                                    "an IP address or a host name"),
        port=port("gateway_port"),
        prometheus_port=port("gateway_prometheus_port"),
        policy=knobs.matching("gateway_policy", data.gateway_policy, POLICY, "an smg policy name (e.g. cache_aware)"),
        health={"endpoint": knobs.matching("gateway_health['endpoint']", health["endpoint"], ENDPOINT,
                                           "a path such as /health"),
                **{k: knobs.integer(f"gateway_health[{k!r}]", health[k], minimum=1) for k in HEALTH_KEYS[1:]}},
        register_timeout_s=knobs.integer("gateway_register_timeout_s", data.gateway_register_timeout_s, minimum=1),
        install_dir=knobs.path("install_dir", data.install_dir),
        config_dir=knobs.path("config_dir", data.config_dir),
        pip_index_url=knobs.url("pip_index_url", data.pip_index_url),
        api_key_env=knobs.matching("api_key_env", data.api_key_env, knobs.ENV_NAME, "a variable name"),
        remove_api_key=knobs.boolean("remove_api_key", data.remove_api_key),
    )


def serves_model(groups) -> bool:
    """In a class group: an SGLang worker (a gateway-only host is in none and skips every GPU stage)."""
    return any(group in HOST_CLASSES for group in groups)


@dataclass(frozen=True)
class Worker:
    name: str
    url: str  # as the gateway reaches it
    problem: str | None = None  # why it cannot be registered


def workers(inventory, gateway_host, model: str) -> list[Worker]:
    """The inventory's workers of `model`, each with its URL on the network the gateway reaches.

    The address is the worker's `gateway_worker_address` if set, else its `ssh_hostname`, else
    its name; a worker on the gateway's own host is reached on loopback.
    """
    found = []
    for worker in inventory:
        if not serves_model(worker.groups):
            continue
        try:
            d = resolve(worker.data, host_class_of(worker.groups), members(inventory, worker))
        except BadHostData as problem:  # refused on its own host too
            found.append(Worker(worker.name, "", f"{worker.name}: {problem}"))
            continue
        if d.served_model_name != model or (d.node_group and not d.node_group.serves_http):
            continue  # a rank >= 1 of a node group serves no HTTP: the group is reached at its rank 0
        if worker is gateway_host:
            found.append(Worker(worker.name, f"http://127.0.0.1:{d.port}"))
            continue
        address = worker.data.get("gateway_worker_address") or worker.data.get("ssh_hostname") or worker.name
        problem = None
        if not ADDRESS.fullmatch(str(address)):
            problem = f"{worker.name}: its address {address!r} is not a host name or IPv4 address"
        elif d.bind_address in LOOPBACK:
            problem = (f"{worker.name} serves on {d.bind_address} only, which the gateway cannot reach: "
                       f"deploy it with bind_address=0.0.0.0 and ${d.api_key_env} set")
        found.append(Worker(worker.name, f"http://{address}:{d.port}", problem))
    return found


@dataclass(frozen=True)
class Route:
    """One gateway in front of a worker, as the worker's host reaches it (to drain and rejoin itself)."""

    gateway: str  # the gateway host's name
    address: str  # where the worker's host reaches the gateway's API
    port: int
    worker_url: str  # the worker as that gateway registers it
    timeout_s: int  # the gateway's register timeout: how long a drain or a rejoin may take
    problem: str | None = None


def _address_of(inventory_host) -> str:
    """A host's address on the serving network: `gateway_worker_address`, else `ssh_hostname`, else its name."""
    data = inventory_host.data
    return str(data.get("gateway_worker_address") or data.get("ssh_hostname") or inventory_host.name)


def routes(inventory, worker_host, model: str) -> list[Route]:
    """The gateways of the inventory serving `model`, each as `worker_host` reaches it: on loopback
    when it is the same host, else at the gateway's bind address (its network address for 0.0.0.0)."""
    found = []
    for gateway_host in inventory:
        if GROUP not in gateway_host.groups:
            continue
        try:
            g = resolve_gateway(gateway_host.data)
        except BadHostData as error:
            found.append(Route(gateway_host.name, "", 0, "", 0, f"{gateway_host.name}: {error}"))
            continue
        if g.model != model:
            continue
        me = next((w for w in workers(inventory, gateway_host, model) if w.name == worker_host.name), None)
        if me is None:  # refused data: the worker fails preflight on its own
            continue
        if gateway_host is worker_host:
            address, problem = "127.0.0.1", None
        elif not g.exposed:
            address, problem = "", (f"{worker_host.name} cannot drain itself from {gateway_host.name}, whose gateway "
                                    f"listens on {g.bind_address} only: set gateway_bind_address (with a key)")
        else:
            address = _address_of(gateway_host) if g.bind_address in ("0.0.0.0", "::") else g.bind_address
            problem = None if ADDRESS.fullmatch(address) else f"{gateway_host.name}: address {address!r} is not accepted"
        found.append(Route(gateway_host.name, address, g.port, me.url, g.register_timeout_s, me.problem or problem))
    return found


def _listing(deployment: Deployment, route: Route) -> dict:
    """The route's gateway's workers of this worker's model, read from the worker's host with its own key."""
    d = deployment
    return host.get_fact(GatewayWorkers, port=route.port, key_file=d.api_key_file, model=d.served_model_name,
                         address=route.address)


def _worker_command(deployment: Deployment, route: Route, action: str) -> str:
    d = deployment
    return inline("gateway_workers", "--address", route.address, str(route.port), d.api_key_file,
                  d.served_model_name, action, str(route.timeout_s), route.worker_url)


@operation()
def drain(deployment: Deployment, routes: list[Route], restart: str | None):
    """
    Take this worker out of its gateways before its server restarts: `DELETE /workers/{id}` (no new
    requests), waited until the gateway lets it go. The restart that follows is systemd's SIGTERM,
    on which SGLang answers 503 to health checks and exits once its in-flight requests are done.

    + deployment: the worker's resolved deployment
    + routes: its gateways as its host reaches them (`routes()`)
    + restart: why the server restarts in this run (unit.restart_reason), None if it does not

    **Example:**

    .. code:: python

        gateway.drain(name="Drain from the gateway", deployment=d, routes=routes(inventory, host, d.served_model_name),
                      restart=unit.restart_reason(d, inputs, [api_key]))
    """
    d = deployment
    problems = [route.problem for route in routes if route.problem]
    if restart is None or (restart == unit.FILES_CHANGED and unit.refusal(d)):
        host.noop("the server does not restart: it stays in its gateways")
        return
    if problems:
        yield fail_host(problems)
        return
    if d.test_only_skip_drain:
        host.noop(f"test_only_skip_drain: restarting without draining ({restart})")
        return
    listed = [route for route in routes
              if any(w["url"] == route.worker_url for w in _listing(d, route)["workers"])]
    if not listed:
        host.noop("no gateway lists this worker: nothing to drain")
    for route in listed:
        yield _worker_command(d, route, "drain")


@operation()
def rejoin(deployment: Deployment, routes: list[Route], drained: OperationMeta):
    """
    Once the restarted server generates, register this worker again (`POST /workers`, waited until
    `ready`) with every gateway of its model that answers; one that does not answer registers it
    in its own stage. Only after a drain in this run: a worker that failed readiness never gets
    here and stays out.

    + deployment: the worker's resolved deployment
    + routes: its gateways as its host reaches them (`routes()`)
    + drained: the drain operation of this run

    **Example:**

    .. code:: python

        gateway.rejoin(name="Back in the gateway", deployment=d, routes=routes, drained=drained)
    """
    if not drained.changed:
        host.noop("not drained in this run: nothing to register again")
        return
    for route in routes:
        listing = _listing(deployment, route)
        if listing["reachable"] and all(w["url"] != route.worker_url for w in listing["workers"]):
            yield _worker_command(deployment, route, "join")


@operation()
def workers_done():
    """
    The point every host passes between the workers' stages and the gateway's: pyinfra orders
    operations by each host's own sequence, so without an operation that workers and gateway
    hosts share, a gateway-only host would register workers before they serve.

    **Example:**

    .. code:: python

        gateway.workers_done(name="Workers done")
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

    def command(self, port: int, key_file: str, model: str, address: str = "127.0.0.1") -> str:
        # Inline: read the same way from the gateway host and from a worker's host, before any upload.
        return inline("gateway_workers", "--address", address, str(port), key_file, model, "list")

    def process(self, output):
        try:
            return json.loads(output[-1])
        except (IndexError, ValueError):
            return {"reachable": False, "workers": [], "error": " ".join(output)[-200:]}


@operation()
def api_key(gateway: Gateway):
    """
    The controller's API key (`api_key_env`) as the gateway's root-owned 0640 key file (group: the
    gateway user). A key already there stays when the controller has none; it is removed only with
    `remove_api_key=true`, which is refused for a gateway listening beyond loopback. The key is read
    here, never an argument.

    + gateway: the host's resolved gateway

    **Example:**

    .. code:: python

        gateway.api_key(name="Gateway API key", gateway=g)
    """
    g = gateway
    key = os.environ.get(g.api_key_env, "")
    state = host.get_fact(FileStates, paths=(g.key_file,)).get(g.key_file)
    if g.exposed and not key and (not state or g.remove_api_key):
        yield fail_host([f"{host.name}: the gateway would listen on {g.bind_address} without a key: "
                         f"set ${g.api_key_env} on the controller or keep gateway_bind_address=127.0.0.1"])
        return
    if key and not state:
        yield f"install -d -m 755 -o root -g root {shlex.quote(posixpath.dirname(g.key_file))}"
    # On stdin, never through files.put, whose contents --diff prints; root's file the launcher can read.
    yield from controller_key_file(g.api_key_env, g.key_file, g.user, remove=g.remove_api_key)


def unit_text(gateway: Gateway, inputs: str) -> str:
    return render("gateway/smg.service.j2", g=gateway, args=[shlex.quote(a) for a in gateway.args()], inputs=inputs)


@operation()
def configure(gateway: Gateway, inputs: str, restart_when: list[OperationMeta]):
    """
    Write the smg unit and (re)start it, only when the unit or a restart input changed.

    + gateway: the host's resolved gateway
    + inputs: what the gateway runs (the smg requirement, its launcher); written into the unit
    + restart_when: operations whose change alone needs a restart (the key, the venv)

    **Example:**

    .. code:: python

        gateway.configure(name="Gateway service", gateway=g, inputs="smg==1.13.0", restart_when=[key])
    """
    g = gateway
    text = unit_text(g, inputs)
    current = host.get_fact(ServiceState, unit_file=g.unit_file, env_file="/dev/null", service=g.service_name)
    if current["unit_sha1"] == sha1_of(text.encode()):
        if any(op.changed for op in restart_when):
            yield from systemd.service._inner(service=g.service_name, running=True, restarted=True, enabled=True)
        elif current["active"] != "active" or current["enabled"] != "enabled":
            yield from systemd.service._inner(service=g.service_name, running=True, enabled=True)
        else:
            host.noop(f"{g.service_name} is running its current unit ({inputs})")
        return
    yield from files.put._inner(src=StringIO(text), dest=g.unit_file, user="root", group="root", mode="644")
    yield from systemd.service._inner(service=g.service_name, running=True, restarted=True, enabled=True,
                                      daemon_reload=True)


@operation()
def register_workers(gateway: Gateway, wanted: list[Worker], restarted: OperationMeta):
    """
    Make the gateway's workers of its model exactly the inventory's: register the missing ones
    (`POST /workers`, waited until `ready`), remove those the inventory no longer has.

    Runs after every worker's readiness (deploy.py's last stage); a worker that failed earlier
    in this run is neither registered nor removed. With nothing to change, nothing is written.

    + gateway: the host's resolved gateway
    + wanted: the inventory's workers of the gateway's model (`workers()`)
    + restarted: the gateway's unit operation (a restarted smg has forgotten its workers)

    **Example:**

    .. code:: python

        gateway.register_workers(name="Gateway workers", gateway=g, wanted=workers(inventory, host, g.model),
                                 restarted=unit)
    """
    g = gateway
    problems = [w.problem for w in wanted if w.problem]
    if problems:
        yield fail_host(problems)
        return
    if not restarted.changed:
        current = host.get_fact(GatewayWorkers, port=g.port, key_file=g.key_file, model=g.model)
        registered = {w["url"]: w["status"] for w in current["workers"]}
        if current["reachable"] and registered == {w.url: "ready" for w in wanted}:
            host.noop(f"the gateway routes {g.model} to its {len(wanted)} inventory workers, all ready")
            return
    yield FunctionCommand(_sync_workers, (g, wanted), {})


def _sync_workers(state, host, gateway: Gateway, wanted: list[Worker]) -> bool:
    """At execution time, after the workers' own stages: skip those that failed in this run."""
    failed = {h.name for h in state.failed_hosts}
    register = [w.url for w in wanted if w.name not in failed]
    command = " ".join(shlex.quote(part) for part in (
        "python3", gateway.script, str(gateway.port), gateway.key_file, gateway.model, "sync",
        str(gateway.register_timeout_s), "--register", *register, "--inventory", *(w.url for w in wanted)))
    started = time.monotonic()
    ok, output = host.run_shell_command(command)
    if not ok:
        host.log_styled(f"gateway workers not converged: {output.stderr or output.stdout}", fg="red")
        return False
    result = json.loads(output.stdout_lines[-1])
    host.log_styled(f"gateway {gateway.model}: registered {result['added'] or 'none'}, "
                    f"removed {result['removed'] or 'none'}; {len(register)} workers ready "
                    f"({time.monotonic() - started:.1f} s)", fg="green")
    return True
