"""Runs ON THE GATEWAY HOST, or on a worker draining itself (as root, stdlib only): the gateway's
workers for one model, read or converged. --address names the gateway (default: this host's loopback).

    gateway_workers.py [--address A] PORT KEY_FILE MODEL list
        prints {"reachable": bool, "workers": [{"id", "url", "status", "model_id"}...], "readiness": {...}}
    gateway_workers.py PORT KEY_FILE MODEL sync TIMEOUT --register URL... --inventory URL...
        DELETEs the model's workers whose URL is not in --inventory, POSTs each --register URL
        not yet registered (with the key toward the worker), waits until every --register URL is
        `ready` and every removed one gone; prints {"added": [...], "removed": [...]}; exit 1 on timeout.
    gateway_workers.py [--address A] PORT KEY_FILE MODEL drain TIMEOUT URL
        DELETEs the worker URL (the gateway stops sending it requests) and waits until the gateway
        has let it go; prints {"removed": [URL]} ([] if it was not registered).
    gateway_workers.py [--address A] PORT KEY_FILE MODEL join TIMEOUT URL
        POSTs the worker URL unless registered and waits until it is `ready`; removes nothing.

The key (the gateway's admin key, which is also the workers' key: on a worker, its own key file) is read from KEY_FILE here,
never passed as an argument. Workers of other models are left alone.
"""

import argparse
import json
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path


def call(gateway: str, key: str, method: str, path: str, body: dict | None = None) -> dict:
    request = urllib.request.Request(f"{gateway}{path}", method=method,
                                     data=None if body is None else json.dumps(body).encode())
    request.add_header("Content-Type", "application/json")
    if key:
        request.add_header("Authorization", f"Bearer {key}")
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read() or b"{}")


def model_workers(gateway: str, key: str, model: str) -> dict[str, dict]:
    """url -> {"id", "url", "status", "model_id"} for the model's registered workers."""
    workers = call(gateway, key, "GET", "/workers")["workers"]
    return {w["url"]: {k: w.get(k) for k in ("id", "url", "status", "model_id")}
            for w in workers if w.get("model_id") == model}


def readiness(gateway: str) -> dict:
    try:
        return call(gateway, "", "GET", "/readiness")
    except urllib.error.HTTPError as error:  # 503 while not ready, with the same JSON body
        return json.loads(error.read() or b"{}")


def list_workers(gateway: str, key: str, model: str) -> dict:
    try:
        return {"reachable": True, "workers": sorted(model_workers(gateway, key, model).values(), key=lambda w: w["url"]),
                "readiness": readiness(gateway)}
    except (OSError, ValueError) as error:
        return {"reachable": False, "error": str(error)[-200:], "workers": []}


def sync(gateway: str, key: str, model: str, timeout: float, register: list[str],
         inventory: list[str] | None) -> dict:
    """Register `register`; with `inventory`, also remove the model's workers not in it."""
    deadline = time.monotonic() + timeout
    while True:  # the gateway may have just (re)started
        try:
            current = model_workers(gateway, key, model)
            break
        except OSError as error:
            if time.monotonic() > deadline:
                raise SystemExit(f"the gateway at {gateway} does not answer: {error}")
            time.sleep(0.5)
    removed = [] if inventory is None else sorted(url for url in current if url not in inventory)
    for url in removed:
        call(gateway, key, "DELETE", f"/workers/{current[url]['id']}")
    added = sorted(url for url in register if url not in current)
    for url in added:
        call(gateway, key, "POST", "/workers", {"url": url, **({"api_key": key} if key else {})})
    while True:
        current = model_workers(gateway, key, model)
        pending = [url for url in register if current.get(url, {}).get("status") != "ready"]
        lingering = [url for url in removed if url in current]
        if not pending and not lingering:
            return {"added": added, "removed": removed}
        if time.monotonic() > deadline:
            states = {url: current.get(url, {}).get("status", "absent") for url in pending + lingering}
            raise SystemExit(f"workers not converged on the gateway after {timeout:.0f}s: {json.dumps(states)}")
        time.sleep(0.5)


def drain(gateway: str, key: str, model: str, timeout: float, url: str) -> dict:
    """Take one worker out of the gateway: DELETE (no new requests), then wait until it is gone.
    smg lets it go after its drain_settle_secs; in-flight requests are the server's to finish."""
    current = model_workers(gateway, key, model)
    if url not in current:
        return {"removed": []}
    call(gateway, key, "DELETE", f"/workers/{current[url]['id']}")
    deadline = time.monotonic() + timeout
    while url in model_workers(gateway, key, model):
        if time.monotonic() > deadline:
            raise SystemExit(f"{url} is still on the gateway {timeout:.0f}s after its removal")
        time.sleep(0.5)
    return {"removed": [url]}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--address", default="127.0.0.1", help="the gateway's address (default: this host)")
    parser.add_argument("port", type=int)
    parser.add_argument("key_file", type=Path)
    parser.add_argument("model")
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("list")
    converge = commands.add_parser("sync")
    converge.add_argument("timeout", type=float)
    converge.add_argument("--register", nargs="*", default=[])
    converge.add_argument("--inventory", nargs="*", default=[])
    for name in ("drain", "join"):
        one = commands.add_parser(name)
        one.add_argument("timeout", type=float)
        one.add_argument("url")
    args = parser.parse_args()
    key = args.key_file.read_text().strip() if args.key_file.is_file() else ""
    gateway = f"http://{args.address}:{args.port}"
    if args.command == "list":
        result = list_workers(gateway, key, args.model)
    elif args.command == "sync":
        result = sync(gateway, key, args.model, args.timeout, args.register, args.inventory)
    elif args.command == "drain":
        result = drain(gateway, key, args.model, args.timeout, args.url)
    else:
        result = sync(gateway, key, args.model, args.timeout, [args.url], None)
    print(json.dumps(result))


if __name__ == "__main__":
    sys.exit(main())
