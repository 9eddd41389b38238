"""Boot this lab (SPECFLEET_LAB_ID) for the benchmarks, side by side with other labs.

`python -m lab up` names each nspawn machine after its host (lab-pcie-1), and
systemd-nspawn names the host's veth end after the machine (vb-lab-pcie-1) and
keeps /run/systemd/nspawn/propagate/<machine>: a second lab booting a host of the
same name fails with "Failed to add new veth interfaces ... File exists". Here
the machine name carries the lab id (l3-pcie-1); everything else is lab.fleet's.
`python -m lab down` stops these hosts as usual (it goes by pid files).
"""

import subprocess
import time

from lab import fleet, services
from lab.config import BRIDGE, LAB_ID


def machine_name(host: fleet.LabHost) -> str:
    return f"l{LAB_ID}{host.name.removeprefix('lab')}"  # lab-pcie-1 -> l3-pcie-1 (veth vb-l3-pcie-1)


def _boot(host: fleet.LabHost) -> None:
    log = open(host.dir / "console.log", "ab")
    process = subprocess.Popen(
        ["systemd-nspawn", "--register=no", "--keep-unit", "--boot", "--quiet",
         f"--directory={host.root}", f"--machine={machine_name(host)}", f"--network-bridge={BRIDGE}",
         "--console=read-only"],
        stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True,
    )
    host.pid_file.write_text(str(process.pid))


def up(spec: str, log=lambda *_: None) -> list[fleet.LabHost]:
    """`python -m lab up --hosts SPEC`, with lab-unique machine names."""
    services.build_content(log=log)
    fleet.ensure_bridge()
    services.start(log=log)
    fleet._boot = _boot
    return fleet.up(spec, log=log)


def down(log=lambda *_: None) -> None:
    fleet.down(log=log)
    services.stop(log=log)


def remove_hosts(log=lambda *_: None) -> None:
    """Stop every host (the hub and index keep running)."""
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
