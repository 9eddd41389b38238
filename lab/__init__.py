"""The specfleet lab: real Debian hosts booted with systemd-nspawn, a local
Hugging Face-compatible hub and a local Python package index, so that every
deploy feature can be exercised without GPUs.

Stand-ins (labelled as such in their own files): the GPU itself (an
``nvidia-smi`` stand-in answering from profiles built from real captured
output, and a ``torch`` whose CUDA and NCCL collectives answer from the same
profiles), and the SGLang engine (a ``sglang`` distribution that parses the real
0.5.23 flag list and serves the real endpoints with deterministic output).

The lab's API, shared by ``python -m lab``, the tests and ``speed/``: ``up()``,
``down()``, ``status()``. Deploy onto it with ``pyinfra lab/inventory.py deploy.py``.
"""

import shutil
from pathlib import Path

from lab import apt_repo, fleet, rootfs, services
from lab.config import LAB_DIR


def up(spec: str = fleet.DEFAULT_SPEC, log=print, bare: set[str] = frozenset(),
       suite: str = rootfs.DEFAULT_SUITE) -> list[fleet.LabHost]:
    """Build (once) and start the hub and index, then boot the hosts of `spec` (idempotent:
    running hosts stay, hosts not in `spec` are stopped); those named in `bare` boot without a driver;
    those booted now boot from Debian `suite` (bookworm, or trixie)."""
    services.build_content(log=log)
    fleet.ensure_bridge()  # the servers bind to the controller's address on it
    services.start(log=log)
    return fleet.up(spec, log=log, bare=bare, suite=suite)


def down(log=print) -> None:
    """Stop and remove every host, the bridge, the hub, the index and the apt repository's gpg-agent, then the
    lab's state directory (its hosts' overlays, hub store, index and keys: ~400 MB); the machine's shared
    roots and downloads stay. A state directory with anything still mounted under it is kept, and said."""
    fleet.down(log=log)
    services.stop(log=log)
    apt_repo.agent_stopped(services.APT_DIR)
    mounted = [line.split()[1] for line in Path("/proc/mounts").read_text().splitlines()
               if line.split()[1] == str(LAB_DIR) or line.split()[1].startswith(f"{LAB_DIR}/")]
    if mounted:
        log(f"lab: {LAB_DIR} kept: {', '.join(mounted)} still mounted")
    else:
        shutil.rmtree(LAB_DIR, ignore_errors=True)


def status() -> dict:
    """Each host with its address, class, GPU profile and systemd state; each server's state."""
    return {"hosts": [{"name": host.name, "address": host.address, "host_class": host.host_class,
                       "gpu_profile": host.gpu_profile, "suite": host.suite, "state": fleet.system_state(host)}
                      for host in fleet.read_fleet()],
            "services": services.status()}
