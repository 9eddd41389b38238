"""
pyinfra operations that put a GPU host's NVIDIA runtime in the state its class needs.

Each reads the facts from operations.gpu.facts and yields commands only where the host
differs; otherwise it reports a noop saying why.
"""

from __future__ import annotations

from pyinfra import host
from pyinfra.api import operation
from pyinfra.operations import server

from operations.failure import fail_host

from .facts import NvidiaDriver, NvidiaFabric, NvidiaGpus

APT_INSTALL = "DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends"
# `systemctl is-enabled` states in which the unit needs no `systemctl enable`.
ENABLED_STATES = {"enabled", "enabled-runtime", "static", "alias", "indirect", "generated"}


def _enable_and_start(unit: str, state: dict):
    if state.get("enabled") == "masked":
        yield fail_host([f"{host.name}: {unit} is masked: `systemctl unmask {unit}` if it should run here"])
        return
    if state.get("enabled") not in ENABLED_STATES:
        yield f"systemctl enable {unit}.service"
    if state.get("active") != "active":
        yield f"systemctl start {unit}.service"


@operation()
def persistence_daemon():
    """
    Turn persistence mode on the way NVIDIA recommends: enable and start nvidia-persistenced
    (the daemon keeps the driver initialised, so CUDA start-up and NVML stay fast).

    **Example:**

    .. code:: python

        from operations.gpu import nvidia
        nvidia.persistence_daemon(name="Keep the NVIDIA driver loaded")
    """
    state = host.get_fact(NvidiaFabric)["units"].get("nvidia-persistenced", {})
    if state.get("enabled") is None:
        yield fail_host([
            f"{host.name}: nvidia-persistenced is not installed; it ships with the NVIDIA driver packages: "
            "install the driver first"
        ])
        return
    commands = list(_enable_and_start("nvidia-persistenced", state))
    if not commands:
        host.noop("nvidia-persistenced is enabled and active")
    yield from commands


def fabric_manager_package(driver_version: str) -> str:
    """The apt package pinned to the driver's exact version (fabric manager refuses any other).

    NVIDIA's repository names it per branch before 580 (``nvidia-fabricmanager-570``) and
    unversioned from 580 on, pinned by version either way.
    """
    branch = driver_version.split(".")[0]
    name = "nvidia-fabricmanager" if int(branch) >= 580 else f"nvidia-fabricmanager-{branch}"
    return f"{name}={driver_version}-1"


@operation()
def fabric_manager():
    """
    Set up what NVSwitch boards need before CUDA can run (else error 802): nvidia-fabricmanager
    at the loaded driver's exact version, enabled and started; on NVLink5 boards (Blackwell,
    compute capability 10.x) also the NVLink Subnet Manager package ``nvlsm``, which fabric
    manager starts, and the ``ib_umad`` module it talks through. A fabric manager already there
    (a vendor image's) is only enabled and started. Packages come from NVIDIA's apt repository.

    **Example:**

    .. code:: python

        from operations.gpu import nvidia
        nvidia.fabric_manager(name="NVSwitch fabric manager")
    """
    driver = host.get_fact(NvidiaDriver)
    if driver is None:
        yield fail_host([f"{host.name}: no NVIDIA driver is loaded: fabric manager must match the driver's version exactly"])
        return
    fabric = host.get_fact(NvidiaFabric)
    nvlink5 = any((gpu.get("compute_capability") or "").startswith("10.") for gpu in host.get_fact(NvidiaGpus) or [])

    manager = fabric["units"].get("nvidia-fabricmanager", {})
    packages = []
    if manager.get("enabled") is None:
        packages.append(fabric_manager_package(driver["version"]))
        manager = {}  # installed just now: neither enabled nor active
    if nvlink5 and "nvlsm" not in fabric["packages"]:
        packages.append("nvlsm")
    commands = [f"{APT_INSTALL} {' '.join(packages)}"] if packages else []
    if nvlink5 and not fabric["ib_umad_loaded"]:
        # Loaded now for this boot, and listed so it loads on the next one.
        commands += ["modprobe ib_umad", "echo ib_umad > /etc/modules-load.d/ib_umad.conf"]
    commands += _enable_and_start("nvidia-fabricmanager", manager)
    if not commands:
        host.noop(f"nvidia-fabricmanager is enabled and active for driver {driver['version']}")
    yield from commands


@operation()
def open_driver(branch: str, install: bool = False, reboot_timeout: int = 900):
    """
    Install the open-kernel-module NVIDIA driver of ``branch`` and reboot into it. Opt-in:
    with ``install=False`` (the default; the deploy passes its ``install_driver`` data flag)
    it only reports, and preflight names the mismatch. The loaded branch must equal ``branch``:
    any other, newer ones included, is replaced by it.

    + branch: driver branch, like ``"580"`` (installs NVIDIA's ``nvidia-open-<branch>``)
    + install: whether this deploy may change the driver at all
    + reboot_timeout: seconds to wait for the host to come back

    **Example:**

    .. code:: python

        from operations.gpu import nvidia
        nvidia.open_driver(
            name="Open NVIDIA driver 580",
            branch="580",
            install=host.data.install_driver,
        )
    """
    driver = host.get_fact(NvidiaDriver)
    module = {True: "open", False: "proprietary", None: "unknown"}[driver and driver["open_kernel_module"]]
    found = "no driver" if driver is None else f"driver {driver['version']} ({module} kernel module)"
    # An unreadable /proc/driver/nvidia/version (None) is no reason to reinstall on every run.
    if driver and driver["version"].split(".")[0] == branch and driver["open_kernel_module"] is not False:
        host.noop(f"{found} is loaded")
        return
    if not install:
        host.noop(f"{found} is loaded, open branch {branch} wanted; install is off, so nothing changes")
        return
    yield f"{APT_INSTALL} nvidia-open-{branch}"
    # The new kernel module only loads on boot; until then nvidia-smi reports a mismatch.
    yield from server.reboot._inner(delay=30, reboot_timeout=reboot_timeout)
