"""A deploy that does not log in as root is refused up front, in one sentence, with or without sudo."""

import pytest

from lab import fleet
from tests.helpers import UNIT_FILE, run_deploy
from tests.helpers import operations_started

pytestmark = pytest.mark.lab

USER = "deployer"


@pytest.fixture
def sudo_user(pcie_host):
    """A user with the lab's SSH key and passwordless sudo, as an operator account often is."""
    fleet.ssh(pcie_host, f"id {USER} >/dev/null 2>&1 || useradd -m -s /bin/bash {USER}; "
                         f"install -d -m 700 -o {USER} -g {USER} /home/{USER}/.ssh; "
                         f"install -m 600 -o {USER} -g {USER} /root/.ssh/authorized_keys /home/{USER}/.ssh/; "
                         f"echo '{USER} ALL=(ALL) NOPASSWD: ALL' > /etc/sudoers.d/{USER}")
    yield USER
    fleet.ssh(pcie_host, f"rm -f /etc/sudoers.d/{USER}; userdel -r {USER} 2>/dev/null; true")


@pytest.mark.parametrize("sudo", [[], ["--sudo"]], ids=["plain", "sudo"])
def test_a_non_root_login_is_refused_before_any_change(deployed_lab, pcie_host, sudo_user, sudo):
    unit = fleet.ssh(pcie_host, f"sha1sum {UNIT_FILE}")
    result = run_deploy("--limit", pcie_host.name, "--data", f"ssh_user={sudo_user}", *sudo, timeout=120)
    assert result.returncode != 0 and "Traceback" not in result.output, result.output[-3000:]
    how = f"{sudo_user} through sudo" if sudo else sudo_user
    assert (f"[{pcie_host.name}] {pcie_host.name}: the deploy logged in as {how}, but it must log in as root"
            in result.output), result.output[-3000:]
    assert operations_started(result.output) == ["Preflight"]
    assert fleet.ssh(pcie_host, f"sha1sum {UNIT_FILE}") == unit
