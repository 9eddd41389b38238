"""Who the deploy logs in as: root, or a user with pyinfra's --sudo (acting as root does); a user without
it is refused up front, in one sentence, under --dry too. The whole path through sudo (deploy, verify,
roll, roll back, benchmark) is tests/lab/test_real_path.py."""

import pytest

from lab import fleet
from tests.helpers import UNIT_FILE, changed_operations, operations_started, run_deploy, write_group_data

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


def test_a_login_without_sudo_is_refused_before_any_change_and_dry_says_so_too(deployed_lab, pcie_host, sudo_user):
    unit = fleet.ssh(pcie_host, f"sha1sum {UNIT_FILE}")
    sentence = (f"[{pcie_host.name}] {pcie_host.name}: the deploy logged in as {sudo_user}, not root: add --sudo to "
                "the pyinfra command (and --same-sudo-password if sudo asks for a password), or log in as root")
    refused = run_deploy("--limit", pcie_host.name, "--data", f"ssh_user={sudo_user}", timeout=120)
    assert refused.returncode != 0 and sentence in refused.output, refused.output[-3000:]
    assert operations_started(refused.output) == ["Preflight"] and "Traceback" not in refused.output
    assert fleet.ssh(pcie_host, f"sha1sum {UNIT_FILE}") == unit
    dry = run_deploy("--limit", pcie_host.name, "--data", f"ssh_user={sudo_user}", "--dry", timeout=120)
    assert sentence in dry.output.split("--> Detected changes:")[0], dry.output[-3000:]


def test_a_sudo_login_finds_the_host_as_a_root_login_does(deployed_lab, pcie_host, sudo_user):
    again = run_deploy("--limit", pcie_host.name, "--data", f"ssh_user={sudo_user}", "--sudo", timeout=300)
    assert again.returncode == 0, again.output[-3000:]
    assert changed_operations(again.output) == [], "changed through sudo"
    other = run_deploy("--limit", pcie_host.name, "--data", f"ssh_user={sudo_user}", "--sudo", "--sudo-user",
                       "sglang", timeout=120)
    assert other.returncode != 0 and (f"{pcie_host.name}: the deploy runs as sglang through sudo, but it must run "
                                      "as root: drop --sudo-user") in other.output, other.output[-3000:]


@pytest.fixture
def password_user(pcie_host):
    """A user whose sudo asks for a password."""
    name, password = "pwuser", "lab-sudo-password"
    fleet.ssh(pcie_host, f"id {name} >/dev/null 2>&1 || useradd -m -s /bin/bash {name}; "
                         f"echo '{name}:{password}' | chpasswd; "
                         f"install -d -m 700 -o {name} -g {name} /home/{name}/.ssh; "
                         f"install -m 600 -o {name} -g {name} /root/.ssh/authorized_keys /home/{name}/.ssh/; "
                         f"echo '{name} ALL=(ALL) ALL' > /etc/sudoers.d/{name}")
    yield name, password
    fleet.ssh(pcie_host, f"rm -f /etc/sudoers.d/{name}; userdel -r {name} 2>/dev/null; true")


def test_sudo_with_a_password_restarts_the_server_and_proves_it_as_root_does(deployed_lab, pcie_host, password_user,
                                                                             tmp_path):
    """The restart's readiness wait runs outside pyinfra's operations (operations/basics/shell.py): it goes
    through sudo with the same password (pyinfra's `_sudo_password`, as --same-sudo-password sets it)."""
    name, password = password_user
    login = ("--limit", pcie_host.name, "--data", f"ssh_user={name}", "--sudo", "--data", f"_sudo_password={password}")
    change = write_group_data(tmp_path, "all", (
        "profiles = copy.deepcopy(base['profiles'])\n"
        "profiles['kimi_k26_dflash']['speculative']['num_draft_tokens'] = 6"))
    try:
        changed = run_deploy(*login, group_data=change, timeout=300)
        assert changed.returncode == 0, changed.output[-3000:]
        assert f"[{pcie_host.name}] serving DFLASH (draft tokens 6)" in changed.output
    finally:
        back = run_deploy(*login, timeout=300)
    assert back.returncode == 0 and f"[{pcie_host.name}] serving DFLASH (draft tokens 8)" in back.output
    assert password not in changed.output + back.output
