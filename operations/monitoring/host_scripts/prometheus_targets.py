"""Runs ON THE GATEWAY HOST (stdlib only): Prometheus's scrape targets, read or waited for.

    prometheus_targets.py ADDRESS PORT [--fresh SECONDS] [--until-up SECONDS JOB=INSTANCE...]
        prints {"reachable": bool, "targets": [{"job", "instance", "health", "error"}...]}
        --fresh: as scraped after this started (waits up to SECONDS for every target's next scrape)
        --until-up: once the targets are the JOB=INSTANCE listed, every one `up` (a reloaded configuration
                    drops a target a moment after the reload returns), or when SECONDS have passed

`health` is Prometheus's: `up`, `down`, or `unknown` before the target's first scrape.
"""

import argparse
import json
import re
import time
import urllib.request
from datetime import datetime, timezone

# Loopback or the lab's own address: never through an outbound proxy.
DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))
RFC3339 = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(\.\d+)?Z$")


def scraped_at(stamp: str) -> float:
    """Prometheus's lastScrape (RFC 3339, UTC, nanoseconds) as a Unix time; 0 before the first scrape."""
    match = RFC3339.match(stamp or "")
    if not match:
        return 0.0
    whole = datetime.fromisoformat(match.group(1)).replace(tzinfo=timezone.utc).timestamp()
    return whole + float(match.group(2) or 0)


def targets(address: str, port: str) -> dict:
    try:
        with DIRECT.open(f"http://{address}:{port}/api/v1/targets?state=active", timeout=10) as response:
            active = json.loads(response.read())["data"]["activeTargets"]
    except (OSError, ValueError, KeyError) as error:
        return {"reachable": False, "targets": [], "error": str(error)[-200:]}
    return {"reachable": True, "targets": sorted(
        ({"job": t["labels"].get("job", ""), "instance": t["labels"].get("instance", ""),
          "health": t.get("health", ""), "error": t.get("lastError", ""),
          "scraped_at": scraped_at(t.get("lastScrape", ""))} for t in active),
        key=lambda t: (t["job"], t["instance"]))}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("address")
    parser.add_argument("port")
    parser.add_argument("--fresh", type=float, default=0)
    parser.add_argument("--until-up", type=float, default=0)
    parser.add_argument("wanted", nargs="*")
    args = parser.parse_intermixed_args()
    started = time.time()
    deadline = time.monotonic() + args.fresh + args.until_up
    wanted = {tuple(spec.split("=", 1)) for spec in args.wanted}
    found = targets(args.address, args.port)
    while time.monotonic() < deadline:
        stale = args.fresh and any(t["scraped_at"] < started for t in found["targets"])
        up = {(t["job"], t["instance"]) for t in found["targets"] if t["health"] == "up"}
        listed = {(t["job"], t["instance"]) for t in found["targets"]}
        if found["reachable"] and not stale and wanted == up == listed:
            break
        time.sleep(1)
        found = targets(args.address, args.port)
    print(json.dumps(found))


if __name__ == "__main__":
    main()
