"""The lab's controller-side servers: the Hugging Face-compatible hub, the package index and
the stand-in NVIDIA apt repository.

Both run as background processes bound to the controller's address on the lab
bridge, so lab hosts reach them exactly as real hosts reach the hub or a mirror.
"""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from lab.config import APT_PORT, CONTROLLER_IP, HUB_CDN_PORT, HUB_PORT, INDEX_PORT, LAB_DIR

HUB_STORE = LAB_DIR / "hub" / "store"
HUB_STATE = LAB_DIR / "hub" / "state"
INDEX_DIR = LAB_DIR / "index"
APT_DIR = LAB_DIR / "apt"
PIDS = LAB_DIR / "services"
REPO_ROOT = Path(__file__).resolve().parent.parent

SERVICES = {
    "hub": (HUB_PORT, ["-m", "lab.hub", "serve", "--store", str(HUB_STORE), "--state", str(HUB_STATE),
                       "--host", CONTROLLER_IP, "--port", str(HUB_PORT),
                       "--cdn-port", str(HUB_CDN_PORT)]),
    "index": (INDEX_PORT, ["-m", "lab.index", "serve", "--dir", str(INDEX_DIR),
                           "--host", CONTROLLER_IP, "--port", str(INDEX_PORT)]),
    # Plain files over HTTP, as NVIDIA serves its repository.
    "apt": (APT_PORT, ["-m", "http.server", "--bind", CONTROLLER_IP, "--directory", str(APT_DIR), str(APT_PORT)]),
}


def build_content(log=print) -> dict[str, str]:
    """Build the hub's repos, the index's wheels and the apt repository (idempotent and cached)."""
    from lab import apt_repo
    from lab.repos import build_lab_repos

    shas = build_lab_repos(HUB_STORE)
    log("lab: building the package index (cached after the first run)")
    subprocess.run([sys.executable, "-m", "lab.index", "build", "--out", str(INDEX_DIR)],
                   check=True, cwd=REPO_ROOT)
    apt_repo.build(APT_DIR)
    return shas


def _pid(name: str) -> int | None:
    try:
        pid = int((PIDS / f"{name}.pid").read_text())
        os.kill(pid, 0)
        return pid
    except (FileNotFoundError, ValueError, ProcessLookupError):
        return None


def _listening(port: int) -> bool:
    """A local socket listens on `port` (a connect test is fooled by this machine's outbound proxy)."""
    listening = "0A"
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            if state == listening and int(local.rsplit(":", 1)[1], 16) == port:
                return True
    return False


def start(log=print) -> None:
    PIDS.mkdir(parents=True, exist_ok=True)
    HUB_STATE.mkdir(parents=True, exist_ok=True)
    for name, (port, args) in SERVICES.items():
        if _pid(name):
            continue
        log(f"lab: starting {name} on {CONTROLLER_IP}:{port}")
        with open(PIDS / f"{name}.log", "ab") as out:
            process = subprocess.Popen([sys.executable, *args], cwd=REPO_ROOT, stdin=subprocess.DEVNULL,
                                       stdout=out, stderr=out, start_new_session=True)
        (PIDS / f"{name}.pid").write_text(str(process.pid))
        deadline = time.monotonic() + 20
        while not _listening(port):
            if process.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"lab: {name} did not start; see {PIDS / (name + '.log')}")
            time.sleep(0.1)


def status() -> dict[str, str]:
    return {name: ("running" if _pid(name) else "stopped") for name in SERVICES}


def stop(log=print) -> None:
    for name in SERVICES:
        pid = _pid(name)
        if pid:
            log(f"lab: stopping {name}")
            os.killpg(pid, signal.SIGTERM)
            deadline = time.monotonic() + 10
            while _pid(name) and time.monotonic() < deadline:
                time.sleep(0.1)
        (PIDS / f"{name}.pid").unlink(missing_ok=True)
