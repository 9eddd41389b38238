"""The one table a deploy ends with: each host, its class, model, endpoint, gateway, state, accept length,
its replicas' KV cache (the engine's own tokens beside the plan's), and the bytes its downloads took from
the hub and from its peers (the weights' fan-out), at what rate.

pyinfra has no end-of-run hook for deploy files. Every host passes one last operation (`summary`); pyinfra
runs it on a host only after every host finished the operations before it, and the last host to reach
it prints the table for all of them, failed ones included, from what the subjects noted during the run
(operations/basics/outcomes.py). It changes nothing, so a re-run that changes nothing stays all no-op.
"""

import weakref
from collections import Counter
from dataclasses import dataclass
from typing import Protocol

from pyinfra import host, logger
from pyinfra.api import operation

from deployment import network, site_data, tuned
from deployment.hosts import Deployment, Host
from operations.basics import outcomes

REFUSAL_WIDTH = 80  # a refusal's first characters in the table; its whole sentence is printed above it
COLUMNS = ("host", "class", "model", "endpoint", "gateway", "state", "accept length", "KV tokens (engine of plan)",
           "weights fetched (hub, peers, rate)")
_rows: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # per run: host name -> its Row
_printed: "weakref.WeakSet" = weakref.WeakSet()  # the runs whose table is printed


class Gateway(Protocol):
    """What the table reads of a host's gateway (deployment/gateway/config.py's Gateway, which the deploy
    passes): the gateway stands above the deployment, which imports none of it."""

    model: str
    bind_address: str
    port: int


@dataclass(frozen=True)
class Row:
    """What the deploy file knows of a host before the run."""

    host: str
    host_class: str
    model: str
    endpoint: str
    gateway: str


def _where(inventory_host, bind_address: str, port: int | str) -> str:
    """The URL a client reaches a server bound to `bind_address` at: loopback is the host's own."""
    if network.is_loopback(bind_address):
        return f"{network.url(network.LOOPBACK, port)} (on the host)"
    address = network.inventory_address(inventory_host) if bind_address in network.WILDCARDS else bind_address
    return network.url(address, port)


def _endpoints(inventory_host, d: Deployment) -> str:
    """Where a deployment serves: its one server's URL, or its replicas' ports."""
    if d.node_group and not d.node_group.serves_http:
        return f"rank {d.node_group.rank} of {d.node_group.name} (served by {d.node_group.members[0]})"
    ports = [r.port for r in d.replicas]
    if len(ports) == 1:
        return _where(inventory_host, d.host.service.bind_address, ports[0])
    where = _where(inventory_host, d.host.service.bind_address, f"{min(ports)}-{max(ports)}")
    return f"{where} ({len(ports)} replicas)"


def row(inventory_host, worker: Host | None, deployments: tuple[Deployment, ...], gateway: Gateway | None,
        behind: tuple[str, ...] = ()) -> Row:
    """The host's row as far as its resolved data tells (a host refused for its data has no worker level, no
    deployments and no gateway); `behind`: the gateway hosts routing its replicas (operations/gateway/
    membership.py routes), said in its gateway column where it runs no gateway itself."""
    known = site_data.host_classes()
    classes = list(dict.fromkeys(group for group in inventory_host.groups if group in known))
    endpoint = "; ".join(_endpoints(inventory_host, d) for d in deployments) or "-"
    model = ", ".join(d.engine.served_model_name for d in deployments) or (gateway.model if gateway else "-")
    return Row(inventory_host.name, worker.host_class if worker else
               (", ".join(classes) or ("gateway" if gateway else "-")),
               model, endpoint, _where(inventory_host, gateway.bind_address, gateway.port) if gateway else
               (f"behind {', '.join(behind)}" if behind else "-"))


def state_of(failed: bool, notes: dict) -> str:
    """A host's state in one phrase, from whether it failed and what its subjects noted."""
    if failed:
        if "refused" not in notes:
            return "failed (its lines above say why)"
        why = notes["refused"]  # printed in full above the table
        return f"failed: {why if len(why) <= REFUSAL_WIDTH else why[:REFUSAL_WIDTH - 3] + '...'}"
    said = []
    if "serving" in notes:
        said.append(f"serving {notes['serving']}")
    if "joined" in notes:
        said.append(f"joined rank 0 ({notes['joined']})")
    if "gateway_workers" in notes:
        count = notes["gateway_workers"]
        said.append(f"gateway routing to {count} worker{'' if count == 1 else 's'}")
    return ", ".join(said) or "done"


def kv_tokens(notes: dict) -> str:
    """Each replica's KV cache: the tokens its engine reported (/server_info max_total_num_tokens) of those
    planned (operations/server/capacity_record.py), "-" for a figure the run did not learn; replicas of the
    same figures once, counted ("8 x ...")."""
    engine, planned = notes.get("kv_engine", {}), notes.get("kv_planned", {})
    figure = lambda tokens: "-" if tokens is None else f"{tokens:,}"  # noqa: E731
    alike = Counter(f"{figure(engine.get(r))} of {figure(planned.get(r))}" for r in sorted(set(engine) | set(planned)))
    return ", ".join(cell if count == 1 else f"{count} x {cell}" for cell, count in alike.items()) or "-"


# Said under the table once any replica's KV figures are in it: what the two figures are, and why an engine
# may hold more than its plan (deployment/server/resident.py: what a rank holds before its pool, measured on
# an H100 and an H200; the lab's stand-in holds none of it, so it sizes a larger pool).
KV_LEGEND = ("KV tokens: each replica's engine (its max_total_num_tokens) of the deploy's plan (preflight's, "
             "kept beside its unit). The plan is a floor, so an engine may hold more: it counts what a GPU holds "
             "before the pool (CUDA's own memory and context, ~1 GiB), which the lab's stand-in engine does not "
             "hold; pytest tests/deployed fails an engine more than 10% below it.")


def weights_fetched(notes: dict) -> str:
    """The bytes this run's downloads took from the hub and from the fan-out's peers, and their rate
    (operations/weights/download.py note_received); "-" for a host that fetched nothing."""
    received = notes.get("weights_received")
    if not received:
        return "-"
    total, seconds = received["hub"] + received["peers"], received["seconds"]
    rate = f"{total / seconds / 1e6:.1f} MB/s" if seconds > 0 else "-"
    return f"{received['hub'] / 1e6:.1f} MB, {received['peers'] / 1e6:.1f} MB, {rate}"


def table(rows: list[Row], failed: set[str], notes: dict[str, dict]) -> list[str]:
    """The summary's lines: a header, then one line per host in inventory order."""
    cells = [COLUMNS]
    for r in rows:
        mine = notes.get(r.host, {})
        accept = mine.get("accept_length")
        cells.append((r.host, r.host_class, r.model, r.endpoint, r.gateway, state_of(r.host in failed, mine),
                      "-" if accept is None else str(accept), kv_tokens(mine), weights_fetched(mine)))
    widths = [max(len(line[i]) for line in cells) for i in range(len(COLUMNS))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(line, widths)).rstrip() for line in cells]
    return lines + ([KV_LEGEND] if any(line[7] != "-" for line in cells[1:]) else [])


def summarize(inventory_host, worker: Host | None, deployments: tuple[Deployment, ...],
              gateway: Gateway | None, behind: tuple[str, ...] = ()) -> None:
    """Describe this host for the run's table and pass the operation that prints it (deploy.py's last line);
    `behind`: the gateway hosts routing its replicas."""
    _rows.setdefault(inventory_host.state, {})[inventory_host.name] = row(inventory_host, worker, deployments, gateway,
                                                                           behind)
    summary(name="Summary")


@operation()
def summary():
    """
    Print the run's table once every host still in the run reached this operation (the last one's turn):
    each host, its class, model, endpoint, gateway, state, accept length and KV tokens. Changes nothing.

    **Example:**

    .. code:: python

        summary.summarize(host, worker, deployments, gateway)  # every host, at the end of deploy.py
    """
    state = host.state
    if not state.is_executing:  # pyinfra detecting changes (--dry, or a run without -y): nothing ran yet
        host.noop("the run's table is printed after it")
        return
    notes = outcomes.noted(state)
    notes.setdefault(host.name, {})["summarized"] = True
    rows = _rows.get(state, {})
    # A host refused before the run (preflight.refuse) counts as failed but reaches this operation too: with
    # every host refused, the first to reach it prints the table, once.
    running = {h.name for h in state.activated_hosts if h not in state.failed_hosts}
    if all(notes.get(name, {}).get("summarized") for name in running) and state not in _printed:
        _printed.add(state)
        described = [rows[h.name] for h in state.inventory if h.name in rows and h in state.activated_hosts]
        logger.info("--> Summary:")
        for line in table(described, {h.name for h in state.failed_hosts}, notes):
            logger.info(line)
    host.noop("the run's table is printed once every host reached it")
    return
    yield  # an operation is a generator


def tuned_report(host_name: str, deployments) -> None:
    """Say, at the start of a run (--dry included), where each deployment's tuned settings came from, or why
    its tuned file is stale (a warning)."""
    for d in deployments:
        if d.tuned is not None:
            (logger.warning if d.tuned.stale else logger.info)(f"{host_name}: {tuned.said(d.name, d.tuned)}")
