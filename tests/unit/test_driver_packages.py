"""operations.gpu.packages and the driver operations: facts in, commands out, per OS release.

Fact outputs are real: dpkg-query, apt-cache madison and /etc/os-release from a lab host
(Debian 12) after the deploy installed the 590 branch from the lab's repository.
"""

import base64
import functools
import hashlib
import http.server
import os
import shlex
import subprocess
import threading

import pytest
from pyinfra.api.command import FunctionCommand
from pyinfra.context import ctx_host
from pyinfra.facts.deb import DebPackages
from pyinfra.facts.server import Arch, KernelVersion, LinuxDistribution

from deployment.hosts import resolve
from deployment.knobs import BadHostData
from operations.basics.apt_packages import AptVersions
from operations.gpu import nvidia, packages
from operations.gpu.facts import NvidiaDriver
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


@pytest.fixture(scope="module")
def keyring_repo(tmp_path_factory):
    """NVIDIA's repository layout on a local HTTP server holding a real (dpkg-deb built) keyring package
    for ubuntu2204/x86_64: (base URL, the package's bytes)."""
    root = tmp_path_factory.mktemp("repos")
    tree = root / "tree"
    (tree / "DEBIAN").mkdir(parents=True)
    (tree / "DEBIAN/control").write_text("Package: cuda-keyring\nVersion: 1.1-1\nArchitecture: all\n"
                                         "Maintainer: test <t@t.invalid>\nDescription: keyring\n")
    deb = root / "repos/ubuntu2204/x86_64" / packages.KEYRING_DEB
    deb.parent.mkdir(parents=True)
    subprocess.run(["dpkg-deb", "--root-owner-group", "--build", str(tree), str(deb)], check=True,
                   capture_output=True)
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
    handler.log_message = lambda *args: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/repos", deb.read_bytes()
    server.shutdown()


def keyring_commands(base_url):
    with ctx_host.use(FakeHost({Arch: "x86_64", LinuxDistribution: UBUNTU2204,
                                NvidiaPackages: NvidiaPackages.default()})):
        return list(nvidia.repository._inner(base_url=base_url))


def test_the_keyring_goes_from_the_controller_through_stdin_to_a_root_only_directory(keyring_repo):
    base_url, deb = keyring_repo
    install, update = keyring_commands(base_url)
    assert str(update) == "apt-get update"
    # Nothing at a name another user could take first (apt.deb downloads to /tmp/pyinfra-<sha1(url)>).
    assert not any("/tmp" in str(getattr(part, "obj", part)) for part in install.bits)
    assert base64.decodebytes(install.connector_arguments["_stdin"].encode()) == deb
    assert hashlib.sha256(deb).hexdigest() in [str(part) for part in install.bits]
    assert nvidia.KEYRING_DIR in str(install)


@pytest.mark.skipif(os.geteuid() != 0, reason="the command sets root's ownership, as on a host")
def test_the_keyring_command_installs_only_what_the_controller_carried(keyring_repo, tmp_path):
    """The command itself, run with a dpkg that records what it is given: a package whose sha256 is not
    the one carried is never handed to dpkg; the one carried is, from the root-only directory."""
    base_url, deb = keyring_repo
    install, _ = keyring_commands(base_url)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "dpkg").write_text(f'#!/bin/sh\nsha256sum "$4" | cut -d" " -f1 >> {tmp_path}/installed\n'
                                  f'stat -c %a "$(dirname "$4")" >> {tmp_path}/installed\n')
    (bin_dir / "dpkg").chmod(0o755)
    keyring_dir = tmp_path / "var/lib/specfleet/nvidia-keyring"
    argv = [str(getattr(part, "obj", part)) for part in install.bits]  # QuoteString's value, unquoted
    argv[argv.index(nvidia.KEYRING_DIR)] = str(keyring_dir)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin"}
    carried = install.connector_arguments["_stdin"]
    swapped = base64.encodebytes(deb + b"\n").decode()  # another package than the one whose sha256 is carried
    assert subprocess.run(argv, input=swapped, text=True, env=env, capture_output=True).returncode != 0
    assert not (tmp_path / "installed").exists()
    assert subprocess.run(argv, input=carried, text=True, env=env, capture_output=True).returncode == 0
    assert (tmp_path / "installed").read_text().split() == [hashlib.sha256(deb).hexdigest(), "700"]
    assert list(keyring_dir.iterdir()) == []  # removed after the install


def test_a_keyring_the_controller_cannot_fetch_fails_the_host_saying_so(keyring_repo):
    base_url, _ = keyring_repo
    [command] = keyring_commands(base_url + "/nowhere")
    assert "the controller could not fetch" in command.args[0][0] and "HTTP Error 404" in command.args[0][0]


def test_repository_noop_with_the_keyring_and_refused_on_other_releases():
    assert run(nvidia.repository, {NvidiaPackages: INSTALLED_590}, base_url="https://nv")[1] == [
        "cuda-keyring is installed"]
    commands, _ = run(nvidia.repository, {LinuxDistribution: distribution("ubuntu", "20.04")}, base_url="https://nv")
    assert commands == ["_report"]


def test_ubuntu_before_590_is_the_branchs_metapackage_and_from_590_on_and_on_debian_a_pin_then_nvidia_open():
    ubuntu, debian = packages.os_release(UBUNTU2404), packages.os_release(DEBIAN12)
    assert packages.driver_installs(ubuntu, 580) == [["nvidia-open-580"]]
    assert packages.driver_installs(ubuntu, 590) == [["nvidia-driver-pinning-590"], ["nvidia-open"]]
    assert packages.driver_installs(debian, 580) == [["nvidia-driver-pinning-580"], ["nvidia-open"]]


INSTALL = "DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends"


def test_fresh_host_gets_the_running_kernels_headers_and_the_branch_lists_updated_only_when_unknown():
    commands, _ = run(nvidia.open_driver, {NvidiaDriver: None, LinuxDistribution: UBUNTU2204}, branch="580",
                      install=True)
    assert commands == ["apt-get update", f"{INSTALL} linux-headers-{KERNEL} nvidia-open-580"]
    known = AptVersions().process(MADISON) | {f"linux-headers-{KERNEL}": ["1"]}
    commands, _ = run(nvidia.open_driver, {NvidiaDriver: None, AptVersions: known, LinuxDistribution: UBUNTU2204},
                      branch="580", install=True)
    assert commands == [f"{INSTALL} linux-headers-{KERNEL} nvidia-open-580"]


def test_a_debian_host_pins_the_branch_then_installs_nvidia_open():
    commands, _ = run(nvidia.open_driver, {NvidiaDriver: None}, branch="580", install=True)
    assert commands == ["apt-get update", f"{INSTALL} linux-headers-{KERNEL} nvidia-driver-pinning-580",
                        f"{INSTALL} nvidia-open"]


def test_upgrade_to_590_unholds_then_pins_then_installs():
    installed_580 = dict(installed={"nvidia-dkms-580-open": "580.95.05-0ubuntu1", "nvidia-open-580": "580.95.05-0ubuntu1"},
                         held=["nvidia-dkms-580-open", "nvidia-open-580"])
    driver = dict(DRIVER_590, version="580.95.05", kernel_module_version="580.95.05")
    commands, _ = run(nvidia.open_driver, {NvidiaDriver: driver, NvidiaPackages: installed_580,
                                           LinuxDistribution: UBUNTU2404}, branch="590", install=True)
    assert commands == ["apt-mark unhold nvidia-dkms-580-open nvidia-open-580", "apt-get update",
                        f"{INSTALL} linux-headers-{KERNEL} nvidia-driver-pinning-590", f"{INSTALL} nvidia-open"]


def test_a_debian_upgrade_installs_nvidia_open_again_though_it_is_installed():
    # Debian names the metapackage alike on every branch: installed at 580, it is installed again under the 590 pin.
    installed_580 = dict(installed={"nvidia-kernel-open-dkms": "580.95.05-1", "nvidia-open": "580.95.05-1",
                                    "nvidia-driver-pinning-580": "580-1"},
                         held=["nvidia-kernel-open-dkms", "nvidia-open"])
    driver = dict(DRIVER_590, version="580.95.05", kernel_module_version="580.95.05")
    commands, _ = run(nvidia.open_driver, {NvidiaDriver: driver, NvidiaPackages: installed_580,
                                           AptVersions: {"nvidia-driver-pinning-590": ["590-1"],
                                                         "nvidia-open": ["590.48.01-1", "580.95.05-1"],
                                                         f"linux-headers-{KERNEL}": ["1"]}},
                      branch="590", install=True)
    assert commands == ["apt-mark unhold nvidia-kernel-open-dkms nvidia-open",
                        f"{INSTALL} linux-headers-{KERNEL} nvidia-driver-pinning-590", f"{INSTALL} nvidia-open"]


@pytest.mark.parametrize("facts", [
    {NvidiaDriver: DRIVER_590, NvidiaPackages: INSTALLED_590},  # installed from packages
    {NvidiaDriver: dict(DRIVER_590, version="595.58.03")},  # loaded from a vendor image's driver
])
def test_a_newer_branch_is_never_downgraded(facts):
    commands, noops = run(nvidia.open_driver, facts, branch="580", install=True)
    assert commands == [] and "newer than branch 580: kept" in noops[0]


def test_a_proprietary_module_of_the_branch_is_replaced_by_the_open_one():
    proprietary = dict(DRIVER_590, version="580.95.05", open_kernel_module=False)
    commands, _ = run(nvidia.open_driver, {NvidiaDriver: proprietary, LinuxDistribution: UBUNTU2204}, branch="580",
                      install=True)
    assert commands[-1].endswith(" nvidia-open-580")


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


def test_fabric_manager_at_the_drivers_exact_version_whatever_the_repositorys_revision():
    assert packages.fabric_packages("580.95.05", True, {}) == ["nvidia-fabricmanager=580.95.05-*", "nvlsm"]
    assert packages.fabric_packages("580.95.05", True, {"nvidia-fabricmanager": "580.82.07-1", "nvlsm": "x"}) == [
        "nvidia-fabricmanager=580.95.05-*"]
    assert packages.fabric_packages("570.158.01", False, {}) == ["nvidia-fabricmanager-570=570.158.01-*"]
    assert packages.fabric_packages("590.48.01", True, INSTALLED_590["installed"]) == []
    # Ubuntu's revisions (-1 or -1ubuntu1 by build): installed at the driver's version is installed.
    for revision in ("580.173.02-1ubuntu1", "580.95.05-1"):
        assert packages.fabric_packages(revision.split("-")[0], False, {"nvidia-fabricmanager": revision}) == []


def test_the_fabric_pin_matches_every_revision_of_the_drivers_version_and_no_other():
    """apt's `pkg=VERSION*` picks the versions that start with VERSION (apt-pkg versionmatch.cc, the
    prefix match NVIDIA's driver container relies on): checked here on the versions repositories carry."""
    [pin] = packages.fabric_packages("580.95.05", False, {})
    prefix = pin.split("=", 1)[1].rstrip("*")
    carried = ["580.95.05-1", "580.95.05-1ubuntu1", "580.95.051-1", "580.82.07-1", "1:580.95.05-1"]
    assert [version for version in carried if version.startswith(prefix)] == ["580.95.05-1", "580.95.05-1ubuntu1"]


@pytest.mark.parametrize("version, driver", [
    ("580.95.05-1", "580.95.05"), ("580.95.05-0ubuntu1", "580.95.05"), ("595.58.03-1ubuntu1", "595.58.03"),
    ("595.71.05-0ubuntu0.24.04.1", "595.71.05"),
])
def test_the_driver_version_of_every_revision_form(version, driver):
    assert packages.upstream(version) == driver


@pytest.mark.parametrize("module", ["nvidia-kernel-open-dkms", "nvidia-dkms-580-open", "nvidia-dkms-open",
                                    "nvidia-kernel-dkms", "nvidia-dkms-580", "nvidia-dkms"])
def test_the_module_package_under_every_name_nvidia_gives_it(module):
    # Debian: nvidia-kernel-(open-)dkms; Ubuntu before 590: nvidia-dkms-580(-open); from 590 on: nvidia-dkms(-open)
    # (NVIDIA driver installation guide, Recent Updates: nvidia-dkms-580-open -> nvidia-dkms-open).
    assert packages.installed_driver({module: "590.48.01-0ubuntu1", "nvidia-open": "590.48.01-0ubuntu1"}) == "590.48.01"


def test_a_ubuntu_590_host_reboots_into_its_new_driver():
    # What an Ubuntu host holds after `nvidia-driver-pinning-590` then `nvidia-open` (lab/apt_repo.py's Ubuntu
    # layout): the module package is nvidia-dkms-open, so the installed driver is known and differs from the loaded.
    installed = NvidiaPackages().process(["hi nvidia-dkms-open 590.48.01-0ubuntu1", "hi nvidia-open 590.48.01-0ubuntu1",
                                          "ii nvidia-driver-pinning-590 590-1ubuntu1"])
    loaded_580 = dict(DRIVER_590, version="580.95.05", kernel_module_version="580.95.05")
    commands, _ = run(nvidia.reboot_into_driver, {NvidiaPackages: installed, NvidiaDriver: loaded_580,
                                                  LinuxDistribution: UBUNTU2404})
    assert "wait_and_reconnect" in commands


def test_plain_http_repositories_only_with_the_knob():
    with pytest.raises(BadHostData, match=r"nvidia_repo_url='http://mirror/repos' is not accepted: use an https:// "
                                          r"URL, or set allow_http_nvidia_repo=true"):
        resolve(host_data("b200_nvlink", nvidia_repo_url="http://mirror/repos"), "b200_nvlink")
    with pytest.raises(BadHostData, match="allow_http_nvidia_repo='perhaps' is not a boolean"):
        resolve(host_data("b200_nvlink", nvidia_repo_url="http://mirror/repos", allow_http_nvidia_repo="perhaps"),
                "b200_nvlink")
    allowed = host_data("b200_nvlink", nvidia_repo_url="http://mirror/repos", allow_http_nvidia_repo="yes")
    assert resolve(allowed, "b200_nvlink").host.gpu.nvidia_repo_url == "http://mirror/repos"
    assert resolve(host_data("b200_nvlink"), "b200_nvlink").host.gpu.nvidia_repo_url.startswith("https://")


PCIE = resolve(host_data("rtx_pro_6000_pcie"), "rtx_pro_6000_pcie").host.gpu.expected
B200 = resolve(host_data("b200_nvlink"), "b200_nvlink").host.gpu.expected


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
