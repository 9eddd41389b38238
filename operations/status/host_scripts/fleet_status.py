"""Runs ON THE HOST (sent inline, as root: it only reads): what status.py shows of a host, answered for
host_state.py in the same round trip as the rest.

`replicas`: per SGLang unit on the host (server_units.py's reading of its unit files), systemd's state
of it, when it last started, and from its /server_info only the SGLang version and the accept length
(/server_info holds every resolved argument, the API keys included: nothing else of it leaves the host).
`gateway`: the gateway's workers of one model, as gateway_workers.py lists them.

    {"sglang@qwen36_ddtree-gpu0": {"port": 30000, "model": "qwen3.6-27b", "loads": [...],
        "active": "active", "sub": "running", "since": "Tue 2026-12-01 23:10:04 UTC", "restarts": 0,
        "version": "0.5.23", "accept_length": 3.2}}
"""

import http.client
import json
import pwd
import socket
import subprocess
from pathlib import Path

import gateway_workers
import probe_server
import server_units

SHOWN = {"ActiveState": "active", "SubState": "sub", "ActiveEnterTimestamp": "since", "NRestarts": "restarts"}


def run_state(unit: str) -> dict:
    shown = subprocess.run(["systemctl", "show", unit, "-p", ",".join(SHOWN)], capture_output=True, text=True,
                           timeout=10).stdout
    found = dict(line.split("=", 1) for line in shown.splitlines() if "=" in line)
    state = {mine: found.get(name) or None for name, mine in SHOWN.items()}
    state["restarts"] = int(state["restarts"] or 0)
    return state


def served(port: int, key_file: str, service_user: str) -> dict:
    """The server's SGLang version and accept length, or why it did not say (over a connection whose
    server end the unit's user owns, as the readiness probe's: the key goes nowhere else)."""
    key = Path(key_file)
    headers = {"Authorization": f"Bearer {key.read_text().strip()}"} if key.is_file() else {}
    try:
        _, info = probe_server.call(port, pwd.getpwnam(service_user).pw_uid, "/server_info", headers, timeout=5)
        states = info.get("internal_states") or [{}]
        return {"version": info.get("version"), "accept_length": states[0].get("avg_spec_accept_length")}
    except (OSError, socket.timeout, http.client.HTTPException, ValueError, KeyError, AttributeError) as error:
        return {"unanswered": (str(error) or type(error).__name__)[:120]}


def replicas(args: dict) -> list[str]:
    """ReplicaStates' lines: one JSON line."""
    units = server_units.main(args["prefix"])
    for name, unit in units.items():
        unit.update(run_state(name))
        if unit["active"] == "active" and unit["port"]:
            unit.update(served(unit["port"], args["key_file"], args.get("users", {}).get(name, args["service_user"])))
    return [json.dumps(units)]


def gateway(args: dict) -> list[str]:
    """GatewayState's line: systemd's state of the gateway's unit and, as `gateway_workers.py ... MODEL list`
    prints them, its workers of its model."""
    try:
        uid = pwd.getpwnam(args["owner"]).pw_uid if args.get("owner") else None
    except KeyError:  # no such user: the gateway is not installed, and no socket here is its
        uid = -1
    g = gateway_workers.Gateway(args["address"], args["port"], gateway_workers.read_key(Path(args["key_file"])), uid)
    return [json.dumps({**run_state(args["unit"]), **gateway_workers.list_workers(g, args["model"])})]


if __name__ == "__main__":  # fleet_status.py replicas|gateway ARGUMENTS_JSON: a fact's own command
    import sys

    print("\n".join({"replicas": replicas, "gateway": gateway}[sys.argv[1]](json.loads(sys.argv[2]))))
