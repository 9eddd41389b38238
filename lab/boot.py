"""Run a lab host's systemd-nspawn, and run it again whenever the host reboots itself.

    python -m lab.boot systemd-nspawn --boot --machine=NAME ...

nspawn exits 133 when systemd inside the container reboots; the host then boots again from
the same root (its overlay keeps its address, host keys and installed packages), as a real
machine comes back from `reboot`. Every boot runs in a new time namespace whose clocks start
at zero, so the host's /proc/uptime restarts as a real machine's does (pyinfra's
server.reboot waits for it to drop). SIGTERM is passed to nspawn, which powers the
container off cleanly, and ends the loop.
"""

import ctypes
import signal
import subprocess
import sys
import time
from pathlib import Path

CONTAINER_REBOOTED = 133  # systemd-nspawn's exit status when the container rebooted
CLONE_NEWTIME = 0x80
LIBC = ctypes.CDLL(None, use_errno=True)


def _new_time_namespace() -> None:
    """Children started from now on see monotonic and boot time counted from now."""
    if LIBC.unshare(CLONE_NEWTIME) != 0:
        raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWTIME)")
    now = int(time.clock_gettime(time.CLOCK_BOOTTIME))
    monotonic = int(time.clock_gettime(time.CLOCK_MONOTONIC))
    Path("/proc/self/timens_offsets").write_text(f"monotonic -{monotonic} 0\nboottime -{now} 0\n")


def main(command: list[str]) -> int:
    stopping = False
    child: subprocess.Popen | None = None

    def stop(signum, frame):
        nonlocal stopping
        stopping = True
        if child:
            child.send_signal(signum)

    signal.signal(signal.SIGTERM, stop)
    while True:
        _new_time_namespace()
        child = subprocess.Popen(command)
        status = child.wait()
        if stopping or status != CONTAINER_REBOOTED:
            return status
        print(f"lab.boot: the host rebooted; booting it again ({time.strftime('%H:%M:%S')})", flush=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
