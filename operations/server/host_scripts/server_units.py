"""Runs ON THE HOST (sent inline, as root: it only reads): the SGLang units the host has, read from
their unit files, so a deploy can retire those its deployments no longer want and keep the weights
they load.

Usage: server_units.py PREFIX. Prints JSON: per unit named PREFIX (the single unit of an earlier
layout) or PREFIX@* (one replica each), the port, served model name and weights directories its
ExecStart names, and the user it runs as:

    {"sglang@qwen36_ddtree-gpu0": {"port": 30000, "model": "qwen3.6-27b", "user": "sglang",
                                   "loads": ["/srv/specfleet/models/Qwen--Qwen3.6-27B/486dd6...", "..."]}}
"""

import glob
import json
import os
import shlex
import sys

UNITS = "/etc/systemd/system"
VALUES = {"--port": "port", "--served-model-name": "model"}
LOADS = ("--model-path", "--speculative-draft-model-path")


def unit(path: str) -> dict:
    found = {"port": None, "model": None, "user": None, "loads": []}
    try:
        with open(path, errors="replace") as f:
            lines = f.read().splitlines()
        words = shlex.split(next((line for line in lines if line.startswith("ExecStart=")), "")[len("ExecStart="):])
    except (OSError, ValueError):
        return found
    found["user"] = next((line[len("User="):].strip() for line in lines if line.startswith("User=")), None)
    for flag, value in zip(words, words[1:]):
        if flag in VALUES:
            found[VALUES[flag]] = int(value) if flag == "--port" and value.isdigit() else value
        elif flag in LOADS:
            found["loads"].append(value)
    return found


def main(prefix: str, units: str = UNITS) -> dict:
    paths = [os.path.join(units, f"{prefix}.service"), *glob.glob(os.path.join(units, glob.escape(prefix) + "@*.service"))]
    return {os.path.basename(path)[:-len(".service")]: unit(path) for path in sorted(paths) if os.path.isfile(path)}


def answer(args: dict) -> list[str]:
    """ServerUnits' lines, for host_state.py."""
    return [json.dumps(main(args["prefix"]))]


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1])))
