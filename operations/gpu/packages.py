"""NVIDIA's driver packages as data, per OS release, and the pure decisions over them.

Facts in, package names and versions out: the operations in operations.gpu.nvidia turn these
into apt commands. Sources: NVIDIA's driver installation guide ("Recent Updates": the 590 renames
on Ubuntu; "Version locking": the pinning packages) and NVIDIA's CUDA repositories as published
(names and versions per release in the project's research notes on NVIDIA packaging).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from typing_extensions import override

from pyinfra.api import FactBase

from deployment.gpu import products

KEYRING_PACKAGE = "cuda-keyring"
KEYRING_DEB = "cuda-keyring_1.1-1_all.deb"
# From this branch on NVIDIA's Ubuntu packages carry no branch in their names ("Starting with branch
# 590, the Ubuntu packages will be renamed by removing the branch designation"); a pinning package
# picks the branch. NVIDIA's Debian repositories never name the branch: a pinning package always picks it.
UNSUFFIXED_FROM = 590
# The package holding the kernel module, under NVIDIA's names of every release and branch (open and
# proprietary): Debian's nvidia-kernel-open-dkms / nvidia-kernel-dkms; Ubuntu's nvidia-dkms-580-open /
# nvidia-dkms-580 before 590, nvidia-dkms-open / nvidia-dkms from 590 on. Its version is the driver the
# host boots into next.
MODULE_PACKAGE = re.compile(r"^(nvidia-kernel-open-dkms|nvidia-kernel-dkms|nvidia-dkms(-\d+)?(-open)?)$")
# Installed NVIDIA packages that must move together: an unattended upgrade of one of them splits
# the driver from its libraries or from fabric manager (which then refuses to start).
HELD = re.compile(r"^(nvidia-.*|libnvidia-.*|nvlsm)$")
# Packages the keyring is, or that pin a branch: moving them is not an upgrade to hold back.
NOT_HELD = re.compile(r"^(cuda-keyring|nvidia-driver-pinning-[0-9.]+)$")


@dataclass(frozen=True)
class OsRelease:
    """What differs between the OS releases NVIDIA's repository serves."""

    repo: str  # NVIDIA's repository directory for the release
    family: str  # "debian" or "ubuntu": how NVIDIA names and versions its packages there


# (ID, VERSION_ID) from /etc/os-release.
OS_RELEASES = {
    ("debian", "12"): OsRelease("debian12", "debian"),  # python3 3.11
    ("debian", "13"): OsRelease("debian13", "debian"),  # python3 3.13
    ("ubuntu", "22.04"): OsRelease("ubuntu2204", "ubuntu"),  # python3 3.10: uv provides 3.11 (operations/python/virtualenvs.py)
    ("ubuntu", "24.04"): OsRelease("ubuntu2404", "ubuntu"),  # python3 3.12
}
# `uname -m` -> NVIDIA's repository architecture.
ARCHES = {"x86_64": "x86_64", "aarch64": "sbsa"}


def os_release(distribution: dict) -> OsRelease | None:
    """The release from pyinfra's LinuxDistribution fact; None where NVIDIA's repo is not supported here."""
    meta = distribution.get("release_meta") or {}
    return OS_RELEASES.get((meta.get("ID", ""), meta.get("VERSION_ID", "")))


def repository(base_url: str, release: OsRelease, machine: str) -> str:
    """The repository for this host, e.g. https://developer.download.nvidia.com/compute/cuda/repos/debian12/x86_64"""
    return f"{base_url.rstrip('/')}/{release.repo}/{ARCHES[machine]}"


def branch_of(version: str | None) -> int | None:
    head = (version or "").split(".")[0]
    return int(head) if head.isdigit() else None


def upstream(version: str | None) -> str | None:
    """The driver version a package version carries: `580.95.05` from `580.95.05-1` (Debian),
    `580.95.05-0ubuntu1` or `595.58.03-1ubuntu1` (Ubuntu)."""
    return version.split(":")[-1].rsplit("-", 1)[0] if version else None


def driver_installs(release: OsRelease, branch: int) -> list[list[str]]:
    """The apt installs, in order, that lay down the open driver of `branch` on `release`.

    Ubuntu before 590: the branch's metapackage (`nvidia-open-580`). Ubuntu from 590 on, and Debian
    for every branch: the pinning package first (its apt pin must be in place before apt chooses
    versions), then the unsuffixed metapackage `nvidia-open`.
    """
    if release.family == "ubuntu" and branch < UNSUFFIXED_FROM:
        return [[f"nvidia-open-{branch}"]]
    return [[f"nvidia-driver-pinning-{branch}"], ["nvidia-open"]]


def installed_driver(installed: dict[str, str]) -> str | None:
    """The driver version the installed module package holds (`580.95.05` from `580.95.05-1`)."""
    versions = [version for name, version in installed.items() if MODULE_PACKAGE.match(name)]
    return upstream(versions[0]) if versions else None


def fabric_package(driver_version: str) -> str:
    """Fabric manager's package for the driver: per branch before 580 (``nvidia-fabricmanager-570``),
    unsuffixed from 580 on (NVIDIA's driver container switches names there, NVIDIA/gpu-driver-container
    ubuntu24.04/install.sh)."""
    branch = branch_of(driver_version)
    return "nvidia-fabricmanager" if branch >= 580 else f"nvidia-fabricmanager-{branch}"


def fabric_packages(driver_version: str, nvlink5: bool, installed: dict[str, str]) -> list[str]:
    """apt arguments for fabric manager at the driver's exact version (it refuses any other) and nvlsm
    on NVLink5, where not installed so.

    The revision after the driver's version is the repository's, and differs: `-1` on Debian, `-1` or
    `-1ubuntu1` on Ubuntu depending on the build (580.95.05-1, 580.173.02-1ubuntu1, 615.71.09-1ubuntu1).
    So the pin names the version and leaves the revision to the repository (`=580.95.05-*`, an apt
    version glob), as NVIDIA's driver container pins it (`=${DRIVER_VERSION}*`)."""
    name = fabric_package(driver_version)
    wanted = [] if upstream(installed.get(name)) == driver_version else [f"{name}={driver_version}-*"]
    if nvlink5 and "nvlsm" not in installed:
        wanted.append("nvlsm")
    return wanted


def to_hold(installed: dict[str, str], held: set[str]) -> list[str]:
    """Installed NVIDIA packages not held yet."""
    return sorted(name for name in installed if HELD.match(name) and not NOT_HELD.match(name) and name not in held)


class NvidiaPackages(FactBase):
    """
    Returns the installed NVIDIA packages (driver parts, fabric manager, nvlsm, the keyring,
    kernel headers) with their versions, and which of them are held.

    .. code:: python

        {"installed": {"nvidia-open-580": "580.95.05-1", "cuda-keyring": "1.1-1"},
         "held": ["nvidia-open-580"]}
    """

    host_answer = "gpu_state.nvidia_packages"

    @staticmethod
    def default() -> dict:
        return dict(installed={}, held=[])

    @override
    def command(self) -> str:
        return ("dpkg-query -W -f='${db:Status-Abbrev} ${Package} ${Version}\\n' "
                f"'nvidia-*' 'libnvidia-*' nvlsm {KEYRING_PACKAGE} 'linux-headers-*' 2>/dev/null || true")

    @override
    def process(self, output: list[str]) -> dict:
        installed, held = {}, []
        for line in output:
            status, name, version = (line.split() + ["", "", ""])[:3]
            if status[1:2] == "i":  # installed, whatever was wanted (h: hold)
                installed[name] = version
                if status[0] == "h":
                    held.append(name)
        return dict(installed=installed, held=held)


class FreshHost(FactBase):
    """
    Returns what can be checked on a host before its driver exists: the vendor:device IDs of the
    NVIDIA display/3D controllers ``lspci -n`` lists (None without lspci). Its Python is checked for
    every host (``operations.python.virtualenvs.python_problems``).

    .. code:: python

        {"nvidia_pci_ids": ["10de:2bb5", "10de:2bb5"]}
    """

    @override
    def command(self) -> str:
        # `lspci -n` lines: "17:00.0 0302: 10de:2bb5 (rev a1)"; class 0300 VGA, 0302 3D controller.
        # Always a line (pci none without lspci): a fact that prints nothing is pyinfra's None.
        return ("if command -v lspci >/dev/null; then echo \"pci $(lspci -n -d 10de: | "
                "awk '$2 ~ /^030[02]:$/ {printf \" %s\", $3}')\"; else echo pci none; fi")

    @staticmethod
    def default() -> dict:
        return dict(nvidia_pci_ids=None)  # nothing known: the GPUs are checked after the driver

    @override
    def process(self, output: list[str]) -> dict:
        facts = self.default()
        for line in output:
            words = line.split()
            if words[:1] == ["pci"] and words[1:] != ["none"]:
                facts["nvidia_pci_ids"] = [word.lower() for word in words[1:]]
        return facts


def before_driver_problems(host_name: str, release_problem: str | None, fresh: dict, host_class: str,
                           expected) -> list[str]:
    """What keeps a host without a driver from getting one and serving: OS release, and the PCI
    bus against the class (`expected`: its GpuExpectations): how many NVIDIA GPUs, and, for the
    products whose PCI IDs are known, whether the class expects them."""
    problems = [release_problem] if release_problem else []
    ids = fresh["nvidia_pci_ids"]
    if ids is None:
        return problems
    if len(ids) != expected.count:
        problems.append(f"{host_name}: expected {expected.count} NVIDIA GPUs on the PCI bus, `lspci -n -d 10de:` lists "
                        f"{len(ids)}: this host belongs to another class, or a GPU is missing")
    foreign = sorted({(pci_id, name) for pci_id in ids if (name := products.name_by_pci_id(pci_id))
                      and not products.named(name, expected.name_patterns)})
    if foreign:
        listed = ", ".join(f"{pci_id} ({name})" for pci_id, name in foreign)
        problems.append(f"{host_name}: `lspci -n` lists {listed}, which the inventory's class {host_class} does "
                        f"not expect: put the host in its class's group, or fix the inventory")
    return problems
