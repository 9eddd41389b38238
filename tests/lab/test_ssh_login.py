"""Who the deploy logs in as: root, or a user with pyinfra's --sudo without a password (acting as root
does, its transfers staged where no other user can reach them); a user without it, or whose sudo takes a
password, is refused up front, in one sentence, under --dry too. The whole path through sudo (deploy, verify,
roll, roll back, benchmark) is tests/lab/test_real_path.py."""

import hashlib
import re

import pytest

from lab import fleet
from operations.basics.ownership import upload_paths
from tests.helpers import ENV_FILE, UNIT_FILE, changed_operations, operations_started, run_deploy

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
                "the pyinfra command (with passwordless sudo for that user), or log in as root")
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


def test_a_sudo_that_takes_a_password_is_refused_in_one_line_before_any_command_carries_it(deployed_lab, pcie_host,
                                                                                          password_user):
    """pyinfra 3.10 would put the password on every escalated command line (operations/basics/shell.py)."""
    name, password = password_user
    unit = fleet.ssh(pcie_host, f"sha1sum {UNIT_FILE}")
    refused = run_deploy("--limit", pcie_host.name, "--data", f"ssh_user={name}", "--sudo",
                         "--data", f"_sudo_password={password}", timeout=120)
    assert refused.returncode != 0 and (
        f"[{pcie_host.name}] {pcie_host.name}: sudo takes a password from {name}, which pyinfra puts on every "
        f"command line it runs through sudo (readable by every local user): give {name} passwordless sudo "
        f"(a line '{name} ALL=(ALL) NOPASSWD: ALL' in /etc/sudoers.d/), then re-run without a sudo password"
    ) in refused.output, refused.output[-3000:]
    assert operations_started(refused.output) == ["Preflight"] and password not in refused.output
    assert fleet.ssh(pcie_host, f"sha1sum {UNIT_FILE}") == unit


def pyinfra_temp_name(dest: str) -> str:
    """Where pyinfra 3.10 stages an upload to `dest` under --sudo by default (api/host.py get_temp_filename)."""
    return f"/tmp/pyinfra-{hashlib.sha1(dest.encode()).hexdigest()}"


def test_files_planted_where_pyinfra_stages_sudo_uploads_are_never_installed(deployed_lab, pcie_host, sudo_user):
    """Another local user creates, world-writable, every name pyinfra would stage the deploy's uploads at
    (its host scripts, removed so they are uploaded again; the unit and its env file). The --sudo deploy
    puts back the host scripts it owns, installs nothing planted, leaves the planted files as they were, and
    names no /tmp/pyinfra-<hex> path even under -vvv --debug."""
    scripts = upload_paths("/opt/specfleet")
    planted = {dest: pyinfra_temp_name(dest) for dest in [*scripts, UNIT_FILE, ENV_FILE]}
    fleet.ssh(pcie_host, "id intruder >/dev/null 2>&1 || useradd -M intruder; "
                         f"rm -f {' '.join(scripts)}; " + " ".join(
                             f"runuser -u intruder -- sh -c 'echo planted > {name}; chmod 666 {name}';"
                             for name in planted.values()))
    try:
        again = run_deploy("--limit", pcie_host.name, "--data", f"ssh_user={sudo_user}", "--sudo", "-vvv",
                           "--debug", timeout=400)
        assert again.returncode == 0, again.output[-3000:]
        assert not re.search(r"/tmp/pyinfra-[0-9a-f]", again.output), re.findall(r".*/tmp/pyinfra-.*", again.output)
        installed = fleet.ssh(pcie_host, f"sha1sum {' '.join(scripts)}")
        assert installed.split() == [part for dest, src in scripts.items()
                                     for part in (hashlib.sha1(src.read_bytes()).hexdigest(), dest)]
        assert "planted" not in fleet.ssh(pcie_host, f"cat {UNIT_FILE} {ENV_FILE}")
        left = fleet.ssh(pcie_host, f"stat -c '%U %s' {' '.join(planted.values())}; ls -d /tmp/specfleet-transfer-* "
                                    "2>/dev/null; true")
        assert left.splitlines() == ["intruder 8"] * len(planted), left  # untouched; no transfer directory left
    finally:
        fleet.ssh(pcie_host, f"rm -f {' '.join(planted.values())}; userdel intruder 2>/dev/null; true")
