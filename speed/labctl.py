"""This lab (SPECFLEET_LAB_ID) as the benchmarks need it: the lab's API, plus fresh hosts on demand."""

import time

import lab
from lab import fleet
from operations.python import virtualenvs


def remove_hosts() -> None:
    """Stop and throw away every host (the hub and index keep running): the next `up` boots fresh ones."""
    for host in fleet.read_fleet():
        fleet.stop_host(host)
    fleet.FLEET_FILE.unlink(missing_ok=True)


def host_python(host, uv: "virtualenvs.Uv") -> dict:
    """The HostPython fact of HOST, read over SSH: what the deploy's installer decides from."""
    facts = {"machine": "x86_64", "python": None, "python_source": None, "uv": None}
    facts.update(virtualenvs.HostPython().process(fleet.ssh(host, virtualenvs.HostPython().command(uv.binary)).splitlines()))
    return facts


if __name__ == "__main__":
    import sys
    started = time.monotonic()
    if sys.argv[1] == "up":
        hosts = lab.up(sys.argv[2])
        print(f"{len(hosts)} hosts up in {time.monotonic() - started:.1f}s")
    else:
        lab.down()
