"""The fleet's state in one table (status.py), read-only: per SGLang unit its state, weights, SGLang version,
endpoint, gateway membership, accept length and last start; per gateway its unit and workers.

Each host is read in one round trip (the basics' host-state program answering this subject's facts,
host_scripts/fleet_status.py); what the inventory's data says of a host (its deployments, its gateway) is
resolved on the controller as the deploy resolves it, and a unit is matched to its replica by name.
"""

import json
import posixpath
import weakref
from dataclasses import dataclass, field

from pyinfra.api import FactBase

from deployment import hosts, roles, site_data
from deployment.gateway import config as gateway_config, membership as gateway_membership
from deployment.gateway.config import Gateway
from deployment.knobs import BadHostData
from deployment.nodes import group as nodes
from deployment.server.config import Server, ServiceHost
from operations.basics import gathering, read_only
from operations.basics.host_programs import inline
from operations.basics.untrusted import printable
from operations.run.summary import _where as where

# Per run: host name -> (its HostView, what was read on it), filled as each host's deploy file runs.
_read: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
COLUMNS = ("host", "class", "deployment", "unit", "state", "weights", "sglang", "endpoint", "gateway",
           "accept length", "last start")


class ReplicaStates(FactBase):
    """
    Every SGLang unit on the host (PREFIX, PREFIX@*): what its unit file names (server_units.py), systemd's
    state and last start, and its server's SGLang version and accept length (host_scripts/fleet_status.py).

    .. code:: python

        {"sglang@qwen36_ddtree-gpu0": {"port": 30000, "model": "qwen3.6-27b", "loads": ["/srv/.../486dd6..."],
            "active": "active", "sub": "running", "since": "Tue 2026-12-01 23:10:04 UTC", "restarts": 0,
            "version": "0.5.23", "accept_length": 3.2}}
    """

    host_answer = "fleet_status.replicas"
    default = dict

    def command(self, prefix: str, key_file: str, service_user: str, users: tuple[tuple[str, str], ...] = ()) -> str:
        """`users`: (unit, user) of each unit that runs as a deployment's own user, not as `service_user`."""
        return inline("fleet_status", "replicas",
                      json.dumps({"prefix": prefix, "key_file": key_file, "service_user": service_user,
                                  **({"users": dict(users)} if users else {})}))

    def process(self, output):
        return json.loads(output[-1])


class GatewayState(FactBase):
    """
    The gateway's unit as systemd sees it and its workers of its model (gateway_workers.py's list).

    .. code:: python

        {"active": "active", "sub": "running", "since": "...", "restarts": 0, "reachable": True,
         "readiness": {"status": "ready", "healthy_workers": 2, "total_workers": 2},
         "workers": [{"id": "01a2...", "url": "http://10.213.1.10:30000", "status": "ready", "model_id": "..."}]}
    """

    host_answer = "fleet_status.gateway"

    def command(self, unit: str, port: int, key_file: str, model: str, address: str, owner: str) -> str:
        return inline("fleet_status", "gateway", json.dumps(
            {"unit": unit, "port": port, "key_file": key_file, "model": model, "address": address, "owner": owner}))

    def process(self, output):
        try:
            return json.loads(output[-1])
        except (IndexError, ValueError):
            return {"reachable": False, "workers": [], "error": " ".join(output)[-200:]}


@dataclass(frozen=True)
class HostView:
    """What the inventory's data says of one host, resolved as the deploy resolves it."""

    name: str
    host_class: str
    service: ServiceHost | None = None  # what every server of the host shares (a worker's)
    replicas: tuple[Server, ...] = ()  # every replica of every deployment, each with its deployment's name
    endpoints: dict[str, str] = field(default_factory=dict)  # unit -> where a client reaches it
    gateway: Gateway | None = None
    problem: str | None = None  # its data cannot be deployed (the deploy refuses it too)

    @property
    def units(self) -> list[str]:
        """Every unit its data gives it: each replica's, then its gateway's."""
        return [*(r.service_name for r in self.replicas), *([self.gateway.service_name] if self.gateway else [])]


@dataclass(frozen=True)
class Membership:
    """One gateway's side: the workers the inventory gives it (``gateway_membership.workers``) and what it lists."""

    gateway: str
    expected: tuple[gateway_membership.Worker, ...]
    listing: dict | None  # its GatewayState; None: its host was not read


def view_of(inventory_host, inventory) -> HostView:
    """The host as its data resolves (a host whose data is refused says why)."""
    h, known = inventory_host, site_data.host_classes()
    host_class = ", ".join(group for group in h.groups if group in known) or \
        ("gateway" if roles.is_gateway(h.groups) else "-")
    try:
        worker, served = hosts.resolve_worker(h.data, hosts.host_class_of(h.groups),
                                                   nodes.members(inventory, h)) \
            if roles.serves_model(h.groups) else (None, ())
        g = gateway_config.resolve(h.data) if roles.is_gateway(h.groups) else None
    except BadHostData as problem:
        return HostView(h.name, host_class, problem=str(problem))
    endpoints = {}
    for d in served:
        for r in d.replicas:
            endpoints[r.service_name] = (f"rank {d.node_group.rank} of {d.node_group.name}"
                                         if d.node_group and not d.node_group.serves_http
                                         else where(h, worker.service.bind_address, r.port))
    if g:
        endpoints[g.service_name] = where(h, g.bind_address, g.port)
    return HostView(h.name, host_class, worker.service if worker else None, tuple(r for d in served for r in d.replicas),
                    endpoints, g)


def memberships(inventory, views: dict[str, HostView], seen: dict[str, dict | None]) -> list[Membership]:
    """Every gateway of the inventory with the workers it should route to and what it lists."""
    fleet = gateway_membership.resolve(inventory)
    return [Membership(h.name, tuple(gateway_membership.workers(fleet, h, views[h.name].gateway.model)),
                       (seen.get(h.name) or {}).get("gateway"))
            for h in inventory if h.name in views and views[h.name].gateway]


def wanted(view: HostView) -> gathering.Wanted:
    """The facts status reads on the host: its SGLang units (with a replica's key and user), its gateway."""
    found: gathering.Wanted = []
    if view.service:
        s = view.service
        users = tuple((r.service_name, r.engine.user) for r in view.replicas if r.engine.own_user)
        found.append((ReplicaStates, dict(prefix=s.service_prefix, key_file=s.api_key_file, service_user=s.service_user,
                                          **({"users": users} if users else {}))))
    if view.gateway:
        g = view.gateway
        found.append((GatewayState, dict(unit=g.service_name, port=g.port, key_file=g.admin_key_file, model=g.model,
                                         address=g.local_address, owner=g.user)))
    return found


def observed(view: HostView) -> dict:
    """{"units": ReplicaStates, "gateway": GatewayState or None}, read in one round trip."""
    facts = wanted(view)
    gathering.gather(facts)
    read = {fact: gathering.read(fact, **kwargs) for fact, kwargs in facts}
    return {"units": read.get(ReplicaStates, {}), "gateway": read.get(GatewayState)}


def membership(host: str, unit: str, gateways: list[Membership]) -> str:
    """The unit's place in each gateway routing its model: ready, failed (the gateway's word), absent,
    unknown (the gateway did not answer); "-" where none routes it."""
    said = []
    for m in gateways:
        for w in (w for w in m.expected if w.name == host and w.replica == unit):
            if not (m.listing or {}).get("reachable"):
                word = "unknown (gateway unread)"
            else:
                status = {listed["url"]: listed["status"] for listed in m.listing["workers"]}.get(w.url)
                word = "absent" if status is None else "ready" if status == "ready" else f"failed ({status})"
            said.append((m.gateway, word))
    if len(said) == 1:
        return said[0][1]
    return "; ".join(f"{name}: {word}" for name, word in said) or "-"


def _state(run: dict) -> str:
    said = f"{run.get('active')} ({run.get('sub')})"
    if run.get("restarts"):
        said += f", {run['restarts']} restarts"
    return said


def records(views: list[HostView], seen: dict[str, dict | None], gateways: list[Membership]) -> list[dict]:
    """One record per unit (an SGLang replica's or a gateway's) of every host, in inventory order; a host
    refused, unread or running no unit has one record saying so. `seen`: each host's `observed`, None
    for a host that was not read."""
    found = []
    for v in views:
        blank = dict.fromkeys(k.replace(" ", "_") for k in COLUMNS)
        base = {**blank, "host": v.name, "class": v.host_class}
        if v.problem:
            found.append({**base, "state": f"refused: {v.problem}"})
            continue
        if seen.get(v.name) is None:
            found.append({**base, "state": "unreachable"})
            continue
        units, by_name = seen[v.name]["units"], {r.service_name: r for r in v.replicas}
        for name in [*by_name, *sorted(set(units) - set(by_name))]:
            run, replica = units.get(name), by_name.get(name)
            found.append({**base, "deployment": replica.engine.name if replica else "(none wants it)", "unit": name,
                          "state": _state(run) if run else "not deployed",
                          "weights": "+".join(posixpath.basename(p)[:8] for p in run["loads"]) if run else None,
                          "sglang": (run or {}).get("version"),
                          "endpoint": v.endpoints.get(name) or (f"port {run['port']}" if run and run["port"] else None),
                          "gateway": membership(v.name, name, gateways),
                          "accept_length": (run or {}).get("accept_length"), "last_start": (run or {}).get("since")})
        g = seen[v.name]["gateway"]
        if v.gateway and g is not None:
            ready = g.get("readiness") or {}
            routing = (f"{ready.get('healthy_workers')}/{ready.get('total_workers')} workers healthy"
                       if g.get("reachable") else "not answering")
            found.append({**base, "class": "gateway", "unit": v.gateway.service_name, "state": _state(g),
                          "endpoint": v.endpoints.get(v.gateway.service_name), "gateway": routing,
                          "last_start": g.get("since")})
        if not units and not by_name and not v.gateway:
            found.append({**base, "state": "no unit"})
    return found


def table(found: list[dict]) -> list[str]:
    """The records as aligned lines under a header ("-" for what is not known). What a server, a gateway or
    systemd on the host answered (a version, an accept length, a worker's status) prints escaped
    (``untrusted.printable``): a hostile server's answer cannot drive the operator's terminal."""
    cells = [COLUMNS, *[tuple("-" if value is None else printable(value) for value in r.values()) for r in found]]
    widths = [max(len(line[i]) for line in cells) for i in range(len(COLUMNS))]
    return ["  ".join(cell.ljust(width) for cell, width in zip(line, widths)).rstrip() for line in cells]


def report(inventory_host, view: HostView, seen: dict | None, as_json: bool) -> None:
    """Keep this host's reading; the last host of the run to be read prints the table (or, `as_json`,
    the records as one JSON list on stdout) and ends the run (read_only). Exits 1 when a selected host
    was refused or not read."""
    state = inventory_host.state
    mine = _read.setdefault(state, {})
    mine[inventory_host.name] = (view, seen)
    if not read_only.last_to_finish(inventory_host):
        return
    inventory = state.inventory
    selected = [h for h in inventory if state.is_host_in_limit(h)]
    views = [mine[h.name][0] if h.name in mine else view_of(h, inventory) for h in selected]
    observed = {name: seen for name, (_, seen) in mine.items()}
    found = records(views, observed, memberships(inventory, {v.name: v for v in views}, observed))
    print(json.dumps(found, indent=1) if as_json else "\n".join(table(found)), flush=True)
    unread = [v.name for v in views if v.problem or observed.get(v.name) is None]
    raise SystemExit(1 if unread else 0)
