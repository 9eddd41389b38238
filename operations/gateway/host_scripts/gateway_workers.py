"""Runs ON THE GATEWAY HOST (as root, stdlib only), where its admin key is: the gateway's workers for one
model, read or converged, a worker's drain included. --address names the gateway (default: this host's
loopback).

    gateway_workers.py [OPTIONS] PORT ADMIN_KEY_FILE MODEL list
        prints {"reachable": bool, "workers": [{"id", "url", "status", "model_id"}...], "readiness": {...}}
    gateway_workers.py [OPTIONS] PORT ADMIN_KEY_FILE MODEL sync TIMEOUT --register URL... --inventory URL...
        DELETEs the model's workers whose URL is not in --inventory, POSTs each --register URL
        not yet registered or `failed` there (removed first), with the workers' key (--worker-key-file),
        waits until every --register URL is `ready` and every removed one gone; prints
        {"added": [...], "removed": [...], "again": [the failed ones registered again]}; exit 1 on timeout.
    gateway_workers.py [OPTIONS] PORT ADMIN_KEY_FILE MODEL drain TIMEOUT URL [--idle SERVER SECONDS]
        DELETEs the worker URL (the gateway stops sending it requests) and waits until the gateway
        has let it go; with --idle, then waits (at most SECONDS) until the server at SERVER (the
        worker's URL as the gateway reaches it) has no request left in flight; prints {"removed": [URL], "in_flight": N, "idle_s": S}.
    gateway_workers.py [OPTIONS] PORT ADMIN_KEY_FILE MODEL join TIMEOUT URL...
        POSTs each worker URL unless registered and waits until every one is `ready`; removes nothing.

OPTIONS: --address A (the gateway's address), --owner USER (the gateway runs on this host as USER:
no key goes to a port another user listens on), --worker-key-file F (the key the gateway sends the
workers: the gateway's clients' key, which the workers take).

Keys are read from their files here, never passed as arguments. The gateway's control plane (GET,
POST, DELETE /workers) takes its admin key, which clients do not have (smg's control-plane keys);
the gateway forwards a client's own key to the worker, so a worker's key is the clients'. A
redirect is never followed: the key would go wherever it points. Workers of other models are left alone.
"""

import argparse
import http.client
import json
import pwd
import re
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

from owned_sockets import LOOPBACK, OwnedConnection

# SGLang 0.5.23's gauges of the requests its schedulers hold (metrics_collector.py:364-381) and of the
# HTTP requests its handlers have not answered yet (http_request_metrics.py:28-45, a stream until its
# first chunk): together they miss only a request between the two (tokenizing, detokenizing), which
# reading them a few times apart catches.
IN_FLIGHT = ("sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:http_requests_active")
# Requests of the probes and scrapes themselves (this very read among them), never a client's.
NOT_REQUESTS = re.compile(r'endpoint="/(metrics|health|health_generate|ready)"')
FAILED = "failed"  # a worker's status in smg's GET /workers once its health checks gave up on it
IDLE_READS = 3  # consecutive reads of nothing in flight, a second apart
SAMPLE = re.compile(r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?P<labels>\{[^}]*\})?\s+(?P<value>\S+)")


class Gateway:
    """The gateway's API at `address`:`port`; `uid`: the user that must own its listening socket
    when it runs on this host (None when it is another host)."""

    def __init__(self, address: str, port: int, admin_key: str, uid: int | None):
        self.address, self.port, self.admin_key, self.uid = address, port, admin_key, uid

    def __str__(self) -> str:
        return f"http://{self.address}:{self.port}"

    def call(self, method: str, path: str, body: dict | None = None, key: bool = True) -> tuple[int, dict]:
        headers = {"Content-Type": "application/json"}
        if key and self.admin_key:
            headers["Authorization"] = f"Bearer {self.admin_key}"
        status, data = request(self.address, self.port, method, path, body, headers, self.uid, "the gateway")
        if status >= 300 and status != 503:  # /readiness answers 503 while not ready, with its JSON
            raise OSError(f"the gateway answered {method} {path} with HTTP {status}"
                          + (": refused the admin key" if status in (401, 403) else "")
                          + (": a redirect, not followed" if 300 <= status < 400 else ""))
        return status, json.loads(data or b"{}")


def request(address: str, port: int, method: str, path: str, body: dict | None, headers: dict,
            uid: int | None, whose: str, timeout: float = 10) -> tuple[int, bytes]:
    """One HTTP request, never redirected: (status, body)."""
    connection = (OwnedConnection(address, port, uid, timeout, whose) if uid is not None else
                  http.client.HTTPConnection(address, port, timeout=timeout))
    try:
        connection.request(method, path, body=None if body is None else json.dumps(body).encode(), headers=headers)
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


# What this program reads of a worker in smg's listing: smg 1.13's `status` (ready / not_ready / failed). smg's
# later source lists `is_healthy` instead, which a sync keyed on `status` would wait on until its timeout.
SUPPORTED = "smg 1.13 (gateway_requirement smg==1.13.0)"


def model_workers(gateway: Gateway, model: str) -> dict[str, dict]:
    """url -> {"id", "url", "status", "model_id"} for the model's registered workers; exits naming the gateway
    versions it reads where a worker is listed without a status."""
    workers = gateway.call("GET", "/workers")[1]["workers"]
    if any("status" not in w for w in workers):
        raise SystemExit(f"the gateway at {gateway} lists workers without smg 1.13's `status` field: the worker "
                         f"sync reads {SUPPORTED} alone; pin gateway_requirement to smg==1.13.0")
    return {w["url"]: {k: w.get(k) for k in ("id", "url", "status", "model_id")}
            for w in workers if w.get("model_id") == model}


def list_workers(gateway: Gateway, model: str) -> dict:
    try:
        return {"reachable": True, "workers": sorted(model_workers(gateway, model).values(), key=lambda w: w["url"]),
                "readiness": gateway.call("GET", "/readiness", key=False)[1]}
    except (OSError, ValueError, http.client.HTTPException) as error:
        return {"reachable": False, "error": str(error)[-200:], "workers": []}


def sync(gateway: Gateway, model: str, timeout: float, register: list[str], inventory: list[str] | None,
         worker_key: str) -> dict:
    """Register `register`; with `inventory`, also remove the model's workers not in it."""
    deadline = time.monotonic() + timeout
    while True:  # the gateway may have just (re)started
        try:
            current = model_workers(gateway, model)
            break
        except (OSError, http.client.HTTPException) as error:
            if time.monotonic() > deadline or isinstance(error, PermissionError):
                raise SystemExit(f"the gateway at {gateway} does not answer: {error}")
            time.sleep(0.5)
    removed = [] if inventory is None else sorted(url for url in current if url not in inventory)
    # A worker smg gave up on reads as absent: smg 1.13.0 brings it back by itself once it answers
    # again, newer smg only by a removal, so it is removed and registered again (after smg let it go).
    again = sorted(url for url in register if current.get(url, {}).get("status") == FAILED)
    for url in removed + again:
        gateway.call("DELETE", f"/workers/{current[url]['id']}")
    gone(gateway, model, again, deadline)
    added = sorted(url for url in register if url not in current or url in again)
    for url in added:
        gateway.call("POST", "/workers", {"url": url, **({"api_key": worker_key} if worker_key else {})})
    while True:
        current = model_workers(gateway, model)
        pending = [url for url in register if current.get(url, {}).get("status") != "ready"]
        lingering = [url for url in removed if url in current]
        if not pending and not lingering:
            return {"added": added, "removed": removed, "again": again}
        if time.monotonic() > deadline:
            states = {url: current.get(url, {}).get("status", "absent") for url in pending + lingering}
            raise SystemExit(f"workers not converged on the gateway after {timeout:.0f}s: {json.dumps(states)}")
        time.sleep(0.5)


def gone(gateway: Gateway, model: str, urls: list[str], deadline: float) -> None:
    """Wait until the gateway lists none of `urls` (smg removes a worker after its drain_settle_secs)."""
    while lingering := [url for url in urls if url in model_workers(gateway, model)]:
        if time.monotonic() > deadline:
            raise SystemExit(f"{', '.join(lingering)} still on the gateway after its removal")
        time.sleep(0.5)


def in_flight(metrics: str) -> int:
    """The requests a server holds, from its Prometheus text (IN_FLIGHT, summed over every label set)."""
    total = 0.0
    for line in metrics.splitlines():
        sample = SAMPLE.match(line)
        if sample and sample["name"] in IN_FLIGHT and not NOT_REQUESTS.search(sample["labels"] or ""):
            total += float(sample["value"])
    return round(total)


def server_in_flight(server: str) -> int | None:
    """The requests in flight at the server (its URL as the gateway reaches it), read from its /metrics, which takes
    no key; 0 when nothing listens (a stopped server holds none), None when it cannot tell."""
    where = urlsplit(server)
    try:
        status, data = request(where.hostname, where.port, "GET", "/metrics", None, {}, None, "the server")
    except ConnectionRefusedError:
        return 0
    except (OSError, http.client.HTTPException):
        return None
    return in_flight(data.decode(errors="replace")) if status == 200 else None


def wait_idle(server: str, timeout: float) -> dict:
    """Wait until the server reads nothing in flight IDLE_READS times in a row, at most `timeout`:
    {"in_flight": what it held when the wait ended, "idle_s": how long it took}."""
    started = time.monotonic()
    quiet, count = 0, None
    while quiet < IDLE_READS and time.monotonic() - started < timeout:
        count = server_in_flight(server)
        quiet = quiet + 1 if count == 0 else 0
        if quiet < IDLE_READS:
            time.sleep(1)
    return {"in_flight": count, "idle_s": round(time.monotonic() - started, 1)}


def drain(gateway: Gateway, model: str, timeout: float, url: str, idle: tuple[str, float] | None) -> dict:
    """Take one worker out of the gateway: DELETE (no new requests), then wait until it is gone
    (smg lets it go after its drain_settle_secs without waiting for the requests in flight); with
    `idle`, wait for those at the server itself."""
    current = model_workers(gateway, model)
    removed = []
    if url in current:
        gateway.call("DELETE", f"/workers/{current[url]['id']}")
        gone(gateway, model, [url], time.monotonic() + timeout)
        removed = [url]
    return {"removed": removed, **(wait_idle(*idle) if idle else {})}


def read_key(path: Path | None) -> str:
    return path.read_text().strip() if path and path.is_file() else ""


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--address", default=LOOPBACK, help="the gateway's address (default: this host)")
    parser.add_argument("--owner", help="the gateway runs on this host as this user")
    parser.add_argument("--worker-key-file", type=Path, help="the key the gateway sends its workers")
    parser.add_argument("port", type=int)
    parser.add_argument("key_file", type=Path, help="the gateway's admin key")
    parser.add_argument("model")
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("list")
    converge = commands.add_parser("sync")
    converge.add_argument("timeout", type=float)
    converge.add_argument("--register", nargs="*", default=[])
    converge.add_argument("--inventory", nargs="*", default=[])
    drain_one = commands.add_parser("drain")
    drain_one.add_argument("timeout", type=float)
    drain_one.add_argument("url")
    drain_one.add_argument("--idle", nargs=2, metavar=("SERVER", "SECONDS"))
    join = commands.add_parser("join")
    join.add_argument("timeout", type=float)
    join.add_argument("urls", nargs="+")
    args = parser.parse_args()
    try:
        uid = pwd.getpwnam(args.owner).pw_uid if args.owner else None
    except KeyError:  # no such user yet (the gateway is not installed): no socket of this host is its
        uid = -1
    gateway = Gateway(args.address, args.port, read_key(args.key_file), uid)
    worker_key = read_key(args.worker_key_file)
    try:
        if args.command == "list":
            result = list_workers(gateway, args.model)
        elif args.command == "sync":
            result = sync(gateway, args.model, args.timeout, args.register, args.inventory, worker_key)
        elif args.command == "drain":
            idle = (args.idle[0], float(args.idle[1])) if args.idle else None
            result = drain(gateway, args.model, args.timeout, args.url, idle)
        else:
            result = sync(gateway, args.model, args.timeout, args.urls, None, worker_key)
    except (OSError, ValueError, http.client.HTTPException) as error:
        raise SystemExit(f"gateway {gateway}: {error}")
    print(json.dumps(result))


if __name__ == "__main__":
    sys.exit(main())
