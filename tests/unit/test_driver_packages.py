"""operations.gpu.packages and the driver operations: facts in, commands out, per OS release.

Fact outputs are real: dpkg-query, apt-cache madison and /etc/os-release from a lab host
(Debian 12) after the deploy installed the 590 branch from the lab's repository.
"""

import shlex
import subprocess

import pytest
from pyinfra.api.command import FunctionCommand
from pyinfra.context import ctx_host
from pyinfra.facts.deb import DebPackages
from pyinfra.facts.server import Arch, KernelVersion, LinuxDistribution

from operations.deployment import resolve
from operations.gpu import nvidia, packages
from operations.gpu.facts import NvidiaDriver
from operations.basics.apt_packages import AptVersions
from operations.gpu.packages import FreshHost, NvidiaPackages
from tests.unit.group_data import host_data

DPKG_590 = """\
ii  cuda-keyring 1.1-1
un  libnvidia-compute-580 
hi  libnvidia-ml1 590.48.01-1
ii  linux-headers-6.18.44-fc-v595 1-lab
un  nvidia-dkms-580-open 
ii  nvidia-driver-pinning-590 590.48.01-1
hi  nvidia-fabricmanager 590.48.01-1
un  nvidia-fabricmanager-590 
hi  nvidia-kernel-open-dkms 590.48.01-1
hi  nvidia-open 590.48.01-1
ii  nvidia-persistenced 590.48.01-1
hi  nvidia-smi 590.48.01-1
hi  nvlsm 2025.06.1-1
""".splitlines()
MADISON = """\
nvidia-open-580 | 580.95.05-1 | http://10.219.0.1:8863/compute/cuda/repos/debian12/x86_64  Packages
nvidia-open-580 | 580.82.07-1 | http://10.219.0.1:8863/compute/cuda/repos/debian12/x86_64  Packages
nvidia-driver-pinning-590 | 590.48.01-1 | http://10.219.0.1:8863/compute/cuda/repos/debian12/x86_64  Packages
""".splitlines()
KERNEL = "6.8.0-45-generic"


def distribution(os_id: str, version: str) -> dict:
    return {"name": os_id.title(), "release_meta": {"ID": os_id, "VERSION_ID": version,
                                                     "PRETTY_NAME": f"{os_id.title()} {version}"}}


DEBIAN12, UBUNTU2204, UBUNTU2404 = distribution("debian", "12"), distribution("ubuntu", "22.04"), distribution("ubuntu", "24.04")
INSTALLED_590 = NvidiaPackages().process(DPKG_590)
DRIVER_590 = dict(version="590.48.01", kernel_module_version="590.48.01", open_kernel_module=True, cuda_version="13.1")


class FakeHost:
    """pyinfra's Host as the operations use it: facts by class (None where not given), noop, log."""

    name = "gpu-host"
    current_op_global_arguments = None

    def __init__(self, facts):
        self.facts, self.noops = facts, []

    def get_fact(self, fact_class, *args, **kwargs):
        return self.facts.get(fact_class)

    def noop(self, description):
        self.noops.append(description)

    def log_styled(self, *args, **kwargs):
        pass

    def get_temp_filename(self, *args, **kwargs):
        return "/tmp/pyinfra-keyring"


def run(operation, facts, **kwargs):
    host = FakeHost({Arch: "x86_64", KernelVersion: KERNEL, LinuxDistribution: DEBIAN12,
                     NvidiaPackages: NvidiaPackages.default(), AptVersions: {}, DebPackages: {}, **facts})
    with ctx_host.use(host):
        commands = [command.function.__name__ if isinstance(command, FunctionCommand) else str(command)
                    for command in operation._inner(**kwargs)]
    return commands, host.noops


@pytest.mark.parametrize("dist, machine, url", [
    (DEBIAN12, "x86_64", "https://nv/repos/debian12/x86_64"),
    (distribution("debian", "13"), "x86_64", "https://nv/repos/debian13/x86_64"),
    (UBUNTU2204, "x86_64", "https://nv/repos/ubuntu2204/x86_64"),
    (UBUNTU2404, "aarch64", "https://nv/repos/ubuntu2404/sbsa"),
])
def test_repository_per_os_release_and_architecture(dist, machine, url):
    assert packages.repository("https://nv/repos/", packages.os_release(dist), machine) == url


def test_repository_is_added_with_the_keyring_package_then_lists_updated():
    commands, _ = run(nvidia.repository, {LinuxDistribution: UBUNTU2204}, base_url="https://nv/repos")
    assert any("https://nv/repos/ubuntu2204/x86_64/cuda-keyring_1.1-1_all.deb" in c for c in commands), commands
    assert "dpkg --force-confdef --force-confold -i /tmp/pyinfra-keyring" in commands
    assert commands[-1] == "apt-get update"


def test_repository_noop_with_the_keyring_and_refused_on_other_releases():
    assert run(nvidia.repository, {NvidiaPackages: INSTALLED_590}, base_url="https://nv")[1] == [
        "cuda-keyring is installed"]
    commands, _ = run(nvidia.repository, {LinuxDistribution: distribution("ubuntu", "20.04")}, base_url="https://nv")
    assert commands == ["_report"]


def test_branch_580_is_its_metapackage_and_590_on_a_pin_then_the_unsuffixed_one():
    assert packages.driver_installs(580) == [["nvidia-open-580"]]
    assert packages.driver_installs(590) == [["nvidia-driver-pinning-590"], ["nvidia-open"]]


def test_fresh_host_gets_the_running_kernels_headers_and_the_branch_lists_updated_only_when_unknown():
    commands, _ = run(nvidia.open_driver, {NvidiaDriver: None}, branch="580", install=True)
    assert commands[0] == "apt-get update"  # apt knows neither package yet
    assert commands[1].endswith(f"install --no-install-recommends linux-headers-{KERNEL} nvidia-open-580")
    known = AptVersions().process(MADISON) | {f"linux-headers-{KERNEL}": ["1"]}
    commands, _ = run(nvidia.open_driver, {NvidiaDriver: None, AptVersions: known}, branch="580", install=True)
    assert len(commands) == 1 and commands[0].endswith("nvidia-open-580")


def test_upgrade_to_590_unholds_then_pins_then_installs():
    installed_580 = dict(installed={"nvidia-dkms-580-open": "580.95.05-1", "nvidia-open-580": "580.95.05-1"},
                         held=["nvidia-dkms-580-open", "nvidia-open-580"])
    driver = dict(DRIVER_590, version="580.95.05", kernel_module_version="580.95.05")
    commands, _ = run(nvidia.open_driver, {NvidiaDriver: driver, NvidiaPackages: installed_580,
                                           LinuxDistribution: UBUNTU2404}, branch="590", install=True)
    installs = [c for c in commands if " install " in c]
    assert commands[0] == "apt-mark unhold nvidia-dkms-580-open nvidia-open-580"
    assert installs[0].endswith(f"linux-headers-{KERNEL} nvidia-driver-pinning-590")
    assert installs[1].endswith("install --no-install-recommends nvidia-open")


@pytest.mark.parametrize("facts", [
    {NvidiaDriver: DRIVER_590, NvidiaPackages: INSTALLED_590},  # installed from packages
    {NvidiaDriver: dict(DRIVER_590, version="595.58.03")},  # loaded from a vendor image's driver
])
def test_a_newer_branch_is_never_downgraded(facts):
    commands, noops = run(nvidia.open_driver, facts, branch="580", install=True)
    assert commands == [] and "newer than branch 580: kept" in noops[0]


def test_a_proprietary_module_of_the_branch_is_replaced_by_the_open_one():
    proprietary = dict(DRIVER_590, version="580.95.05", open_kernel_module=False)
    commands, _ = run(nvidia.open_driver, {NvidiaDriver: proprietary}, branch="580", install=True)
    assert commands[-1].endswith("nvidia-open-580")


def test_without_install_driver_nothing_changes():
    commands, noops = run(nvidia.open_driver, {NvidiaDriver: None}, branch="580")
    assert commands == [] and noops == ["no driver, open branch 580 wanted; install_driver is off, so nothing changes"]


def test_reboot_only_when_the_installed_module_is_not_the_loaded_one():
    loaded_580 = dict(DRIVER_590, kernel_module_version="580.95.05")
    commands, _ = run(nvidia.reboot_into_driver, {NvidiaPackages: INSTALLED_590, NvidiaDriver: loaded_580})
    assert "( sleep 1 && reboot ) </dev/null >/dev/null 2>&1 &" in commands and "wait_and_reconnect" in commands
    assert run(nvidia.reboot_into_driver, {NvidiaPackages: INSTALLED_590, NvidiaDriver: DRIVER_590})[0] == []
    assert run(nvidia.reboot_into_driver, {NvidiaDriver: DRIVER_590})[1] == ["no driver installed from packages"]


def test_installed_driver_and_holds_from_real_dpkg_output():
    assert INSTALLED_590["installed"]["nvidia-kernel-open-dkms"] == "590.48.01-1"
    assert "libnvidia-compute-580" not in INSTALLED_590["installed"]  # `un`: known, not installed
    assert packages.installed_driver(INSTALLED_590["installed"]) == "590.48.01"
    assert packages.to_hold(INSTALLED_590["installed"], set(INSTALLED_590["held"])) == ["nvidia-persistenced"]
    commands, _ = run(nvidia.hold_driver, {NvidiaPackages: INSTALLED_590})
    assert commands == ["apt-mark hold nvidia-persistenced"]


def test_fabric_manager_at_the_drivers_exact_version():
    assert packages.fabric_packages("580.95.05", True, {}) == ["nvidia-fabricmanager=580.95.05-1", "nvlsm"]
    assert packages.fabric_packages("580.95.05", True, {"nvidia-fabricmanager": "580.82.07-1", "nvlsm": "x"}) == [
        "nvidia-fabricmanager=580.95.05-1"]
    assert packages.fabric_packages("570.158.01", False, {}) == ["nvidia-fabricmanager-570=570.158.01-1"]
    assert packages.fabric_packages("590.48.01", True, INSTALLED_590["installed"]) == []


PCIE = resolve(host_data("rtx_pro_6000_pcie"), "rtx_pro_6000_pcie").gpu.expected
B200 = resolve(host_data("b200_nvlink"), "b200_nvlink").gpu.expected


def lspci(*devices: str) -> list[str]:
    """What FreshHost's command prints for `lspci -n` lines such as "17:00.0 0302: 10de:2bb5 (rev a1)"."""
    return ["pci" + "".join(f" 10de:{device}" for device in devices)]


def test_before_the_driver_an_unsupported_release_is_the_problem():
    fresh = FreshHost().process(lspci(*["2bb5"] * 8))
    assert packages.before_driver_problems("gpu-host", None, fresh, "rtx_pro_6000_pcie", PCIE) == []
    assert packages.before_driver_problems("gpu-host", "gpu-host: debian 11 is not served", fresh,
                                           "rtx_pro_6000_pcie", PCIE) == ["gpu-host: debian 11 is not served"]


def test_without_lspci_the_fresh_host_fact_still_answers():
    assert "else echo pci none" in FreshHost().command()
    assert FreshHost().process(["pci none"]) == {"nvidia_pci_ids": None}
    assert FreshHost().process(["pci"]) == {"nvidia_pci_ids": []}  # lspci, but no NVIDIA GPU


def test_the_fresh_host_command_lists_the_ids_of_display_and_3d_controllers_only():
    """The command's awk over `lspci -n` lines (NVIDIA's audio function 0403 and bridges are not GPUs)."""
    lines = "17:00.0 0302: 10de:2bb5 (rev a1)\n17:00.1 0403: 10de:22e8 (rev a1)\n0000:c1:00.0 0300: 10de:2bb1 (rev a1)\n"
    script = FreshHost().command().replace("lspci -n -d 10de:", f"printf {shlex.quote(lines)}")
    printed = subprocess.run(["bash", "-c", script.replace("command -v lspci", "true")], capture_output=True,
                             text=True, check=True).stdout.splitlines()
    assert FreshHost().process(printed) == {"nvidia_pci_ids": ["10de:2bb5", "10de:2bb1"]}


def test_before_the_driver_the_pci_bus_shows_the_gpu_count_when_lspci_exists():
    fresh = FreshHost().process(lspci(*["2bb5"] * 7))
    [problem] = packages.before_driver_problems("gpu-host", None, fresh, "rtx_pro_6000_pcie", PCIE)
    assert "expected 8 NVIDIA GPUs on the PCI bus, `lspci -n -d 10de:` lists 7" in problem


def test_before_the_driver_the_pci_ids_tell_a_host_in_the_wrong_class():
    pro_cards = FreshHost().process(lspci(*["2bb5"] * 8))
    [problem] = packages.before_driver_problems("gpu-host", None, pro_cards, "b200_nvlink", B200)
    assert problem == ("gpu-host: `lspci -n` lists 10de:2bb5 (NVIDIA RTX PRO 6000 Blackwell Server Edition), which "
                       "the inventory's class b200_nvlink does not expect: put the host in its class's group, or "
                       "fix the inventory")
    h200 = FreshHost().process(lspci(*["2335"] * 8))
    assert "10de:2335 (NVIDIA H200)" in packages.before_driver_problems("gpu-host", None, h200, "rtx_pro_6000_pcie",
                                                                         PCIE)[0]
    # IDs no source here names (a B200's) are checked by count only.
    assert packages.before_driver_problems("gpu-host", None, FreshHost().process(lspci(*["2901"] * 8)),
                                           "b200_nvlink", B200) == []
