"""Run a lab host's systemd-nspawn, and run it again whenever the host reboots itself.

    python -m lab.boot systemd-nspawn --boot --machine=NAME ...

nspawn exits 133 when systemd inside the container reboots; the host then boots again from
the same root (its overlay keeps its address, host keys and installed packages), as a real
machine comes back from `reboot`. Every boot runs in a new time namespace whose clocks start
at zero, so the host's /proc/uptime restarts as a real machine's does (pyinfra's
server.reboot waits for it to drop). SIGTERM is passed to nspawn, which powers the
container off cleanly, and ends the loop; a host being removed is killed whole instead (kill_machine).

Each host gets a cgroup of its own (in the cgroup v2 tree its systemd tracks units in) before
nspawn starts. nspawn started with --keep-unit by a controller that systemd does not run leaves every
container in the cgroup it was started from, so without this the hosts' systemd instances (of
every lab on the machine) share one tree: a unit's cgroup then holds that unit's processes from
all the hosts, the others' read as pid 0, systemd fails to kill the control group ("Failed to
kill control group ...: Input/output error") and signals the unit's main process only, which is
not what KillMode= does on a real host.
"""

import ctypes
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

CONTAINER_REBOOTED = 133  # systemd-nspawn's exit status when the container rebooted
# The cgroup v2 tree a host's systemd tracks its units in, on a controller in hybrid mode (the hosts boot
# with the unified hierarchy, lab/fleet.py).
UNIFIED_TREE = "/sys/fs/cgroup/unified"
CLONE_NEWTIME = 0x80
LIBC = ctypes.CDLL(None, use_errno=True)


def _new_time_namespace() -> None:
    """Children started from now on see monotonic and boot time counted from now."""
    if LIBC.unshare(CLONE_NEWTIME) != 0:
        raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWTIME)")
    now = int(time.clock_gettime(time.CLOCK_BOOTTIME))
    monotonic = int(time.clock_gettime(time.CLOCK_MONOTONIC))
    Path("/proc/self/timens_offsets").write_text(f"monotonic -{monotonic} 0\nboottime -{now} 0\n")


def _own_cgroup(machine: str) -> Path | None:
    """Move this process (and so nspawn and the container) into a cgroup named after the machine."""
    if not os.path.ismount(UNIFIED_TREE):
        return None
    path = Path(UNIFIED_TREE, "specfleet-lab", machine)
    path.mkdir(parents=True, exist_ok=True)
    (path / "cgroup.procs").write_text(f"{os.getpid()}\n")
    return path


def _remove_empty_cgroups(path: Path) -> None:
    """`path` and the cgroups below it, deepest first (a cgroup goes once it holds no process)."""
    for directory in sorted((p for p in path.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)) + [path]:
        try:
            directory.rmdir()
        except OSError:
            pass


def _remove_cgroup(path: Path | None) -> None:
    """The host's cgroup, emptied by its poweroff, deepest first (this process moved out first)."""
    if path is None:
        return
    try:
        (path.parent / "cgroup.procs").write_text(f"{os.getpid()}\n")
    except OSError:
        return
    _remove_empty_cgroups(path)


def kill_machine(machine: str, timeout: float = 30) -> bool:
    """Kill every process of a host that is being removed at once (its cgroup's cgroup.kill), nspawn and
    this wrapper included; False where the host has no such cgroup. A poweroff would run each unit's stop
    and systemd's shutdown first, CPU a lab deleted next has no use for (43 hosts' systemd-shutdown alone
    took 50 CPU-s of one make test)."""
    path = Path(UNIFIED_TREE, "specfleet-lab", machine)
    try:
        (path / "cgroup.kill").write_text("1\n")
    except OSError:
        return False
    deadline = time.monotonic() + timeout
    while "populated 1" in (path / "cgroup.events").read_text() and time.monotonic() < deadline:
        time.sleep(0.05)
    _remove_empty_cgroups(path)
    return True


def main(command: list[str]) -> int:
    stopping = False
    child: subprocess.Popen | None = None

    def stop(signum, frame):
        nonlocal stopping
        stopping = True
        if child:
            child.send_signal(signum)

    signal.signal(signal.SIGTERM, stop)
    machine = next(arg.split("=", 1)[1] for arg in command if arg.startswith("--machine="))
    cgroup = _own_cgroup(machine)
    while True:
        _new_time_namespace()
        child = subprocess.Popen(command)
        status = child.wait()
        if stopping or status != CONTAINER_REBOOTED:
            _remove_cgroup(cgroup)
            return status
        print(f"lab.boot: the host rebooted; booting it again ({time.strftime('%H:%M:%S')})", flush=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
