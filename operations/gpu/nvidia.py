"""
pyinfra operations that put a GPU host's NVIDIA runtime in the state its class needs.

Each reads the facts from operations.gpu.facts and yields commands only where the host
differs; otherwise it reports a noop saying why.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import shlex
import urllib.request

from pyinfra import host
from pyinfra.api import QuoteString, StringCommand, operation
from pyinfra.facts.server import Arch, KernelVersion, LinuxDistribution
from pyinfra.operations import apt, server

from operations.basics import gathering
from operations.basics.apt_packages import AptVersions
from operations.basics.failing import fail_host

from . import packages
from .facts import NvidiaDriver, NvidiaFabric, NvidiaGpus, NvidiaHost
from .packages import NvidiaPackages

# apt-get by hand where exact versions go down as well as up over held packages (fabric manager
# follows the driver): apt.packages' present/latest states do not say that.
APT_INSTALL = "DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends"
# `systemctl is-enabled` states in which the unit needs no `systemctl enable`.
ENABLED_STATES = {"enabled", "enabled-runtime", "static", "alias", "indirect", "generated"}


def _enable_and_start(unit: str, state: dict):
    # From the unit state the host-state gathering read: systemd.service would read it again, one
    # more round trip per unit on every no-op.
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
    state = gathering.read(NvidiaFabric)["units"].get("nvidia-persistenced", {})
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


@operation()
def fabric_manager():
    """
    Set up what NVSwitch boards need before CUDA can run (else error 802): nvidia-fabricmanager
    at the loaded driver's exact version, enabled and started; on NVLink5 boards (Blackwell,
    compute capability 10.x) also the NVLink Subnet Manager package ``nvlsm``, which fabric
    manager starts, and the ``ib_umad`` module it talks through. A fabric manager at another
    version (it would refuse to start) is replaced by the driver's and restarted. Packages come
    from NVIDIA's apt repository (``repository``).

    **Example:**

    .. code:: python

        from operations.gpu import nvidia
        nvidia.fabric_manager(name="NVSwitch fabric manager")
    """
    driver = gathering.read(NvidiaDriver)
    if driver is None:
        yield fail_host([f"{host.name}: no NVIDIA driver is loaded: fabric manager must match the driver's version exactly"])
        return
    fabric = gathering.read(NvidiaFabric)
    gpus = gathering.read(NvidiaGpus)
    nvlink5 = any((gpu.get("compute_capability") or "").startswith("10.") for gpu in
                  (gpus if isinstance(gpus, list) else []))

    manager = fabric["units"].get("nvidia-fabricmanager", {})
    wanted = packages.fabric_packages(driver["version"], nvlink5, fabric["packages"])
    commands = []
    if wanted:
        # Fabric manager follows the driver, down as well as up, held or not.
        # Quoted: the version is an apt glob (`=580.95.05-*`), not the shell's.
        commands.append(f"{APT_INSTALL} --allow-downgrades --allow-change-held-packages "
                        f"{' '.join(shlex.quote(name) for name in wanted)}")
        if manager.get("active") == "active" and "=" in wanted[0]:
            commands.append("systemctl restart nvidia-fabricmanager.service")
        manager = manager if manager.get("enabled") is not None else {}  # installed just now: not enabled
    if nvlink5 and not fabric["ib_umad_loaded"]:
        # Loaded now for this boot, and listed so it loads on the next one.
        commands += ["modprobe ib_umad", "echo ib_umad > /etc/modules-load.d/ib_umad.conf"]
    commands += _enable_and_start("nvidia-fabricmanager", manager)
    if not commands:
        host.noop(f"nvidia-fabricmanager is enabled and active for driver {driver['version']}")
    yield from commands


def host_release():
    """This host's OS release in NVIDIA's repository, or the reason there is none."""
    distribution = gathering.read(LinuxDistribution)
    release = packages.os_release(distribution)
    machine = gathering.read(Arch)
    if release is None or machine not in packages.ARCHES:
        meta = distribution.get("release_meta") or {}
        supported = ", ".join(f"{name} {version}" for name, version in packages.OS_RELEASES)
        return None, (f"{host.name}: {meta.get('PRETTY_NAME', 'this OS')} on {machine or 'an unknown machine'} is not a release "
                      f"NVIDIA's repository serves here (supported: {supported}; x86_64 or aarch64)")
    return release, None


# Where the keyring package lands on the host: root's alone (0700), so no other user can put a package
# there first for root to install (a fixed name under /tmp, as apt.deb downloads to, would let one).
KEYRING_DIR = "/var/lib/specfleet/nvidia-keyring"
# Writes stdin (base64) to a new file in "$1", installs it with dpkg only if its sha256 is "$2", removes it.
_INSTALL_KEYRING = ('umask 077 && install -d -m 0700 -o root -g root "$1" && t=$(mktemp "$1/cuda-keyring.XXXXXX") '
                    '&& { base64 -d > "$t" && echo "$2  $t" | sha256sum --check --quiet - '
                    '&& dpkg --force-confdef --force-confold -i "$t"; rc=$?; rm -f "$t"; exit $rc; }')


@functools.cache
def fetched_keyring(url: str) -> bytes | str:
    """The keyring package at `url`, fetched once per run on the controller (over https unless the user
    allowed http: config.repo_url); a str says why there is none."""
    try:
        with urllib.request.urlopen(url, timeout=60) as answer:
            deb = answer.read()
    except (OSError, ValueError) as error:
        return f"the controller could not fetch {url} ({error}): it carries NVIDIA's keyring to the host, so it " \
               "must reach the repository"
    if not deb.startswith(b"!<arch>\ndebian-binary"):
        return f"{url} is not a Debian package (it starts {deb[:16]!r}): check nvidia_repo_url"
    return deb


@operation()
def repository(base_url: str):
    """
    Add NVIDIA's CUDA apt repository the way NVIDIA documents it: its ``cuda-keyring`` package
    for this host's OS release and architecture (the key and the source line), then update
    the package lists. A host that has the keyring is left as it is.

    The controller fetches the package and carries it to the host on a command's standard input,
    with its sha256; the host writes it to a new file in a directory only root can write
    (``KEYRING_DIR``), installs it only if the sha256 matches, and removes it.

    + base_url: where NVIDIA's repositories are (the OS release and architecture are appended)

    **Example:**

    .. code:: python

        from operations.gpu import nvidia
        nvidia.repository(
            name="NVIDIA apt repository",
            base_url="https://developer.download.nvidia.com/compute/cuda/repos",
        )
    """
    release, problem = host_release()
    if problem:
        yield fail_host([problem])
        return
    if packages.KEYRING_PACKAGE in gathering.read(NvidiaPackages)["installed"]:
        host.noop(f"{packages.KEYRING_PACKAGE} is installed")
        return
    deb = fetched_keyring(f"{packages.repository(base_url, release, gathering.read(Arch))}/{packages.KEYRING_DEB}")
    if isinstance(deb, str):
        yield fail_host([f"{host.name}: {deb}"])
        return
    yield StringCommand("sh", "-c", QuoteString(_INSTALL_KEYRING), "keyring", QuoteString(KEYRING_DIR),
                        hashlib.sha256(deb).hexdigest(), _stdin=base64.encodebytes(deb).decode())
    yield from apt.update._inner()


@operation()
def open_driver(branch: str, install: bool = False):
    """
    Install the open-kernel-module NVIDIA driver of ``branch`` with the running kernel's headers
    (DKMS builds the module against them). Opt-in: with ``install=False`` (the default; the deploy
    passes its ``install_driver`` data flag) it only reports. Never downgrades: a host whose driver
    (installed or loaded) is of ``branch`` or newer keeps it. The new module is loaded by
    ``reboot_into_driver``.

    + branch: driver branch, like ``"580"`` (Ubuntu before 590: ``nvidia-open-580``; Ubuntu from 590 on and
      Debian: ``nvidia-driver-pinning-<branch>`` then ``nvidia-open``)
    + install: whether this deploy may change the driver at all

    **Example:**

    .. code:: python

        from operations.gpu import nvidia
        nvidia.open_driver(
            name="Open NVIDIA driver 580",
            branch="580",
            install=host.data.install_driver,
        )
    """
    driver = gathering.read(NvidiaDriver)
    nvidia_packages = gathering.read(NvidiaPackages)
    installed = packages.installed_driver(nvidia_packages["installed"])
    loaded = driver and driver["version"]
    current = max((v for v in (installed, loaded) if v), key=packages.branch_of, default=None)
    proprietary = driver is not None and driver["open_kernel_module"] is False
    if current and packages.branch_of(current) >= int(branch) and not proprietary:
        newer = "" if packages.branch_of(current) == int(branch) else f", newer than branch {branch}: kept"
        host.noop(f"driver {current} is installed{newer}")
        return
    found = f"driver {current}" if current else "no driver"
    if not install:
        host.noop(f"{found}, open branch {branch} wanted; install_driver is off, so nothing changes")
        return
    release, problem = host_release()
    if problem:
        yield fail_host([problem])
        return
    if nvidia_packages["held"]:
        # apt removes no held package, and a new branch replaces them: held again by hold_driver.
        yield f"apt-mark unhold {' '.join(nvidia_packages['held'])}"
    steps = packages.driver_installs(release, int(branch))
    # DKMS needs the running kernel's headers before the module package is configured.
    steps[0] = [f"linux-headers-{host.get_fact(KernelVersion)}", *steps[0]]
    if any(name not in host.get_fact(AptVersions, packages=tuple(n for step in steps for n in step))
           for step in steps for name in step):
        yield from apt.update._inner()  # apt does not know the branch's packages yet
    # apt-get by hand: the metapackage keeps its name across branches (nvidia-open), so "installed" says
    # nothing of the branch; the pinning package installed first makes apt's candidate the branch's.
    for names in steps:
        yield f"{APT_INSTALL} {' '.join(names)}"


@operation()
def reboot_into_driver(reboot_timeout: int = 900):
    """
    Reboot when the installed kernel module is not the loaded one (a driver just installed or
    upgraded: until the reboot nvidia-smi reports a version mismatch), and wait for the host.
    Operations after this one read the GPU facts of the rebooted host.

    + reboot_timeout: seconds to wait for the host to come back

    **Example:**

    .. code:: python

        from operations.gpu import nvidia
        nvidia.reboot_into_driver(name="Boot into the installed driver")
    """
    installed = packages.installed_driver(gathering.read(NvidiaPackages)["installed"])
    driver = gathering.read(NvidiaDriver)
    loaded = driver and driver["kernel_module_version"]
    if installed is None or installed == loaded:
        host.noop(f"the loaded module is the installed driver {installed}" if installed
                  else "no driver installed from packages")
        return
    host.log_styled(f"rebooting: driver {installed} installed, {loaded or 'none'} loaded", fg="yellow")
    yield from server.reboot._inner(delay=10, interval=1, reboot_timeout=reboot_timeout)


@operation()
def hold_driver():
    """
    Hold the installed NVIDIA driver packages and fabric manager (``apt-mark hold``), so that an
    unattended upgrade cannot move one without the others: fabric manager refuses to start with
    a driver of another version, and a new module needs a reboot.

    **Example:**

    .. code:: python

        from operations.gpu import nvidia
        nvidia.hold_driver(name="Hold the NVIDIA packages")
    """
    nvidia_packages = gathering.read(NvidiaPackages)
    names = packages.to_hold(nvidia_packages["installed"], set(nvidia_packages["held"]))
    if not names:
        host.noop(f"{len(nvidia_packages['held'])} NVIDIA packages held")
        return
    yield f"apt-mark hold {' '.join(names)}"


@gathering.wants
def _read(deployment) -> gathering.Wanted:
    wanted = [*((part, {}) for part in NvidiaHost.PARTS), (NvidiaFabric, {})]
    if deployment.host.gpu.nvidia_packages:
        wanted += [(NvidiaPackages, {}), (LinuxDistribution, {}), (Arch, {})]
    return wanted
