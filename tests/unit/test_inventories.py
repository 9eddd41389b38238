"""The real inventories: known targets only, verified host keys, the SSH config's User."""

import runpy

import pytest
from pyinfra.connectors.sshuserclient.client import SSHClient

from tests.helpers import REPO

SSH_CONFIG = "Host ct200\n    HostName 192.0.2.10\n    User ops\n"


@pytest.fixture
def home(tmp_path, monkeypatch):
    """An empty HOME (no SSH config) and none of the inventories' variables."""
    for name in ("SPECFLEET_CT200_HOST", "SPECFLEET_CT200_USER", "SPECFLEET_B200_HOSTS", "SPECFLEET_B300_HOSTS",
                 "SPECFLEET_SSH_USER", "SPECFLEET_SSH_STRICT_HOST_KEY_CHECKING", "SPECFLEET_GATEWAY_HOST"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / ".ssh").mkdir()
    return tmp_path


def inventory(name: str) -> dict:
    return runpy.run_path(str(REPO / "inventory" / f"{name}.py"))


@pytest.mark.parametrize("name, variable", [("ct200", "SPECFLEET_CT200_HOST"), ("b200", "SPECFLEET_B200_HOSTS"),
                                            ("b300", "SPECFLEET_B300_HOSTS")])
def test_no_target_is_invented_when_nothing_names_one(home, name, variable):
    with pytest.raises(SystemExit) as stopped:
        inventory(name)
    assert variable in str(stopped.value) and "\n" not in str(stopped.value)


def test_host_keys_are_verified_unless_the_user_chooses_otherwise(home, monkeypatch):
    monkeypatch.setenv("SPECFLEET_B200_HOSTS", "b200-a, b200-b")
    assert inventory("b200")["b200_nvlink"] == [("b200-a", {"ssh_strict_host_key_checking": "yes"}),
                                                ("b200-b", {"ssh_strict_host_key_checking": "yes"})]
    monkeypatch.setenv("SPECFLEET_SSH_STRICT_HOST_KEY_CHECKING", "accept-new")
    assert inventory("b200")["b200_nvlink"][0][1] == {"ssh_strict_host_key_checking": "accept-new"}
    monkeypatch.setenv("SPECFLEET_SSH_STRICT_HOST_KEY_CHECKING", "off")
    with pytest.raises(SystemExit, match="use yes, accept-new or no"):
        inventory("b200")


def test_ct200_comes_from_the_ssh_config_and_keeps_its_user(home, monkeypatch):
    (home / ".ssh" / "config").write_text(SSH_CONFIG)
    [(target, data)] = inventory("ct200")["rtx_pro_6000_pcie"]
    assert (target, data) == ("ct200", {"ssh_strict_host_key_checking": "yes"})  # no ssh_user: the config's
    # pyinfra's SSH client then connects to the config's HostName as its User.
    hostname, config, *_ = SSHClient().parse_config(target, {}, ssh_config_file=str(home / ".ssh" / "config"),
                                                    strict_host_key_checking=data["ssh_strict_host_key_checking"])
    assert (hostname, config["username"]) == ("192.0.2.10", "ops")
    monkeypatch.setenv("SPECFLEET_CT200_HOST", "10.0.0.7")
    monkeypatch.setenv("SPECFLEET_CT200_USER", "root")
    assert inventory("ct200")["rtx_pro_6000_pcie"] == [
        ("10.0.0.7", {"ssh_strict_host_key_checking": "yes", "ssh_user": "root"})]


JUMP_CONFIG = ("Host ct200\n    HostName 10.1.0.10\n    User root\n    ProxyJump bastion\n"
               "Host bastion\n    HostName 192.0.2.1\n    User ops\n")


def test_a_jump_host_is_held_to_strict_host_key_checking_too(home, monkeypatch):
    (home / ".ssh" / "config").write_text(JUMP_CONFIG)
    # pyinfra connects the hop with the hop's own entry only: with none, its AskPolicy (a prompt that
    # stores whatever key answers), whatever the inventory chose for the target.
    _, _, _, hop_policy, *_ = SSHClient().parse_config("bastion", {}, ssh_config_file=str(home / ".ssh" / "config"))
    assert type(hop_policy).__name__ == "AskPolicy"
    with pytest.raises(SystemExit) as stopped:
        inventory("ct200")
    assert str(stopped.value) == ("ct200: its ProxyJump hop bastion is connected with StrictHostKeyChecking ask "
                                  "(pyinfra applies only the hop's own setting): add `StrictHostKeyChecking yes` to "
                                  "the `Host bastion` entry of your SSH config, with the hop's key in known_hosts")
    monkeypatch.setenv("SPECFLEET_B200_HOSTS", "ct200")
    with pytest.raises(SystemExit, match="ProxyJump hop bastion"):
        inventory("b200")


def test_a_jump_host_whose_entry_checks_its_key_is_accepted(home):
    # (pyinfra reads an SSH config once per path and run: a test of its own, with its own HOME.)
    (home / ".ssh" / "config").write_text(JUMP_CONFIG.replace("ProxyJump bastion", "ProxyJump ops@bastion:2222")
                                          + "    StrictHostKeyChecking yes\n")
    _, _, _, hop_policy, *_ = SSHClient().parse_config("bastion", {}, ssh_config_file=str(home / ".ssh" / "config"))
    assert type(hop_policy).__name__ == "StrictPolicy"
    assert inventory("ct200")["rtx_pro_6000_pcie"] == [("ct200", {"ssh_strict_host_key_checking": "yes"})]


def test_every_inventory_reads_the_documented_user_variable(home, monkeypatch):
    monkeypatch.setenv("SPECFLEET_CT200_HOST", "10.0.0.7")
    monkeypatch.setenv("SPECFLEET_B200_HOSTS", "b200-a")
    monkeypatch.setenv("SPECFLEET_B300_HOSTS", "b300-a")
    monkeypatch.setenv("SPECFLEET_SSH_USER", "ops")
    for name, group in (("ct200", "rtx_pro_6000_pcie"), ("b200", "b200_nvlink"), ("b300", "b300_nvlink")):
        assert inventory(name)[group][0][1]["ssh_user"] == "ops", name
    monkeypatch.setenv("SPECFLEET_CT200_USER", "ct200-ops")  # the box's own variable comes first
    assert inventory("ct200")["rtx_pro_6000_pcie"][0][1]["ssh_user"] == "ct200-ops"


def test_a_gateway_is_one_variable_away_on_a_worker_or_a_host_of_its_own(home, monkeypatch):
    monkeypatch.setenv("SPECFLEET_B200_HOSTS", "b200-a,b200-b")
    assert inventory("b200")["gateway"] == []
    monkeypatch.setenv("SPECFLEET_GATEWAY_HOST", "b200-a")  # a worker carries it: its data stays the worker's
    assert inventory("b200")["gateway"] == [("b200-a", {})]
    monkeypatch.setenv("SPECFLEET_GATEWAY_HOST", "gw-1")
    monkeypatch.setenv("SPECFLEET_SSH_USER", "ops")
    assert inventory("b200")["gateway"] == [("gw-1", {"ssh_strict_host_key_checking": "yes", "ssh_user": "ops"})]
    monkeypatch.setenv("SPECFLEET_CT200_HOST", "ct200")
    assert inventory("ct200")["gateway"] == [("gw-1", {"ssh_strict_host_key_checking": "yes", "ssh_user": "ops"})]


@pytest.mark.parametrize("name", ["ct200", "b200", "b300"])
def test_an_inventory_run_from_outside_the_checkout_says_where_to_run_it(home, name):
    """pyinfra reads group_data/ from its working directory: elsewhere every host would lack the deploy's knobs."""
    import subprocess

    from tests.helpers import PYINFRA

    result = subprocess.run([str(PYINFRA), str(REPO / "inventory" / f"{name}.py"), str(REPO / "deploy.py"), "--dry"],
                            cwd=home, capture_output=True, text=True, timeout=120,
                            env={**__import__("os").environ, "SPECFLEET_CT200_HOST": "192.0.2.10"})
    output = result.stdout + result.stderr
    assert result.returncode == 1 and "Traceback" not in output, output
    assert (f"pyinfra runs in {home}, where it finds no specfleet group_data/ (it reads group data from its "
            f"working directory): run it from the checkout, cd {REPO} (or pyinfra --chdir {REPO} ...)") in output
