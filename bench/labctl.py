"""This lab (SPECFLEET_LAB_ID) as the benchmarks need it: `python -m lab up`'s steps, quietly."""

import time

from lab import fleet, services


def up(spec: str, log=lambda *_: None) -> list[fleet.LabHost]:
    """`python -m lab up --hosts SPEC` (idempotent: running hosts stay, others are stopped)."""
    services.build_content(log=log)
    fleet.ensure_bridge()
    services.start(log=log)
    return fleet.up(spec, log=log)


def down(log=lambda *_: None) -> None:
    fleet.down(log=log)
    services.stop(log=log)


def remove_hosts() -> None:
    """Stop and throw away every host (the hub and index keep running): the next `up` boots fresh ones."""
    for host in fleet.read_fleet():
        fleet.stop_host(host)
    fleet.FLEET_FILE.unlink(missing_ok=True)


if __name__ == "__main__":
    import sys
    started = time.monotonic()
    if sys.argv[1] == "up":
        hosts = up(sys.argv[2], log=print)
        print(f"{len(hosts)} hosts up in {time.monotonic() - started:.1f}s")
    else:
        down(log=print)
