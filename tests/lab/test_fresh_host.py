"""A freshly imaged NVLink host (no driver, no NVIDIA repository) from zero to serving in one
deploy, then a fabric manager split from its driver, an upgrade to the 590 branch, and no
downgrade. One extra bare lab host, booted for this module only."""

import hashlib
import time

import pytest

from lab import config, fleet
from tests.conftest import LAB_HOSTS
from tests.helpers import extra_bare_host, run_deploy
from tests.lab.test_deploy import results_table, server_info

pytestmark = pytest.mark.lab
INSTALL = ("--data", "install_driver=true")


@pytest.fixture(scope="module")
def fresh(lab_hosts):
    yield from extra_bare_host(lab_hosts, "b200", LAB_HOSTS)


def deploy(host, *args):
    result = run_deploy("--limit", host.name, *args)
    assert result.returncode == 0, result.output[-3000:]
    return result


def changed(result) -> set[str]:
    return {op for op, (_, success, _, _) in results_table(result.output).items() if success != "-"}


def loaded_driver(host) -> str:
    return fleet.ssh(host, "cat /proc/driver/nvidia/version").split("x86_64")[1].split()[0]


# Where pyinfra's apt.deb would download the keyring package (host.get_temp_filename(url): /tmp/pyinfra-<sha1>).
KEYRING_URL = f"{config.APT_URL}/debian12/x86_64/cuda-keyring_1.1-1_all.deb"
PLANTED = f"/tmp/pyinfra-{hashlib.sha1(KEYRING_URL.encode()).hexdigest()}"


def plant_a_package(host) -> None:
    """As an unprivileged user, a .deb at the name a download to /tmp would take: root must never install it."""
    fleet.ssh(host, "runuser -u nobody -- sh -c 'mkdir -p /tmp/planted/DEBIAN && printf \"Package: planted-by-nobody"
                    "\\nVersion: 1\\nArchitecture: all\\nMaintainer: x <x@x.invalid>\\nDescription: planted\\n\" "
                    f"> /tmp/planted/DEBIAN/control && dpkg-deb -b /tmp/planted {PLANTED} >/dev/null'")


def test_fresh_host_serves_after_one_deploy_with_install_driver(fresh):
    assert fleet.ssh(fresh, "command -v nvidia-smi; ls /etc/apt/sources.list.d /proc/driver", check=False).split() \
        == ["/etc/apt/sources.list.d:", "/proc/driver:"]
    plant_a_package(fresh)
    start = time.monotonic()
    first = deploy(fresh, *INSTALL)
    wall = time.monotonic() - start
    print(f"\nfrom zero to serving: {wall:.0f} s")
    assert {"NVIDIA apt repository", "NVIDIA open driver", "Boot into the installed driver",
            "NVIDIA persistence daemon", "NVIDIA fabric manager", "Hold the NVIDIA packages"} <= changed(first)
    assert float(fleet.ssh(fresh, "cut -d' ' -f1 /proc/uptime")) < wall, "the host did not reboot"
    assert loaded_driver(fresh) == "580.95.05"
    assert fleet.ssh(fresh, "systemctl is-enabled nvidia-persistenced nvidia-fabricmanager; "
                            "systemctl is-active nvidia-persistenced nvidia-fabricmanager").split() == \
        ["enabled", "enabled", "active", "active"]
    # The planted package was not installed: the keyring came from the controller into root's own directory.
    assert fleet.ssh(fresh, "dpkg-query -W planted-by-nobody", check=False).strip() == ""
    assert fleet.ssh(fresh, "dpkg-query -W -f='${Version}' cuda-keyring") == "1.1-1"
    assert fleet.ssh(fresh, "stat -c '%a %U' /var/lib/specfleet/nvidia-keyring").strip() == "700 root"
    # NVIDIA's Debian names: the branch is the pinning package's, the metapackage and module carry none.
    held = fleet.ssh(fresh, "apt-mark showhold").split()
    assert {"nvidia-open", "nvidia-kernel-open-dkms", "nvidia-fabricmanager", "nvlsm"} <= set(held)
    assert fleet.ssh(fresh, "dpkg-query -W -f='${Version}' nvidia-driver-pinning-580") == "580-1"
    fabric = fleet.ssh(fresh, "nvidia-smi -q | grep -A1 '^    Fabric$' | grep State").splitlines()
    assert len(fabric) == 8 and all(line.split(":")[1].strip() == "Completed" for line in fabric), fabric
    assert server_info(fresh)["speculative_algorithm"] == "DFLASH"
    assert changed(deploy(fresh, *INSTALL)) == set(), "a second run changed something"


def test_fabric_manager_split_from_its_driver_is_put_back(fresh):
    fleet.ssh(fresh, "apt-get install -y -qq --allow-downgrades --allow-change-held-packages "
                     "nvidia-fabricmanager=580.82.07-1 >/dev/null")
    # As an upgrade moving it alone would: apt drops its hold.
    assert changed(deploy(fresh, *INSTALL)) == {"NVIDIA fabric manager", "Hold the NVIDIA packages"}
    assert fleet.ssh(fresh, "dpkg-query -W -f='${Version} ${db:Status-Abbrev}' nvidia-fabricmanager") \
        == "580.95.05-1 hi "
    assert fleet.ssh(fresh, "systemctl is-active nvidia-fabricmanager").strip() == "active"


def test_upgrade_to_590_then_never_back_to_580(fresh):
    upgrade = deploy(fresh, *INSTALL, "--data", "driver_branch=590")
    assert {"NVIDIA open driver", "Boot into the installed driver", "NVIDIA fabric manager"} <= changed(upgrade)
    assert loaded_driver(fresh) == "590.48.01"
    assert fleet.ssh(fresh, "dpkg-query -W -f='${Version}' nvidia-fabricmanager") == "590.48.01-1"
    assert {"nvidia-open", "nvidia-kernel-open-dkms"} <= set(fleet.ssh(fresh, "apt-mark showhold").split())
    # One pin at a time: the 590 pinning package replaced the 580 one.
    assert fleet.ssh(fresh, "dpkg-query -W -f='${Package} ${db:Status-Abbrev}\\n' 'nvidia-driver-pinning-*' | "
                            "grep '^.* ii'").split() == ["nvidia-driver-pinning-590", "ii"]
    assert changed(deploy(fresh, *INSTALL)) == set(), "the 580 minimum touched a 590 host"
    assert loaded_driver(fresh) == "590.48.01"


def test_without_install_driver_a_host_without_driver_is_refused_saying_how(fresh):
    fleet.set_gpu_profile(fresh, fleet.NO_DRIVER)
    refused = run_deploy("--limit", fresh.name)
    assert refused.returncode != 0
    assert "found no nvidia-smi" in refused.output and "`--data install_driver=true`" in refused.output
