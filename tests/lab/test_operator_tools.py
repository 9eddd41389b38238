"""The operator's tools beside deploy.py, on the shared lab: rollout.py --limit, status.py, logs.py, uninstall.py."""

import json
import os
import subprocess
import sys
import time

import pytest

from lab import fleet
from tests.helpers import (LAB_INVENTORY, PYINFRA, REPO, SGLANG_UNIT, behind_gateway, changed_operations, main_pid,
                           run_deploy, write_group_data)
from tests.lab.test_gateway import ADMIN_KEY, EXPOSED, KEY

pytestmark = pytest.mark.lab

STATUS_BUDGET_S = 10  # the whole run, connections included, on a converged lab


def pyinfra(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """`pyinfra lab/inventory.py ARGS` as a user types it (no -y unless given), stdin closed."""
    run = subprocess.run([str(PYINFRA), LAB_INVENTORY, *args], cwd=REPO, capture_output=True, text=True,
                         timeout=timeout, stdin=subprocess.DEVNULL, env={**os.environ, "HF_TOKEN": "hf_lab_granted"})
    run.output = run.stdout + run.stderr
    return run


def test_rollout_limited_to_one_host_restarts_only_that_hosts_units(deployed_lab, pcie_host, b200_host, tmp_path):
    before = {h.name: main_pid(h) for h in (pcie_host, b200_host)}
    changed = write_group_data(tmp_path, "all", (  # a restart input of every host's unit
        "profiles = copy.deepcopy(base['profiles'])\n"
        "profiles['kimi_k26_dflash']['env'] = {'SPECFLEET_LIMIT_TEST': 'changed'}"))
    try:
        run = subprocess.run([sys.executable, "rollout.py", LAB_INVENTORY, "--limit", pcie_host.name,
                              "--group-data", str(changed)], cwd=REPO, capture_output=True, text=True, timeout=600,
                             env={**os.environ, "HF_TOKEN": "hf_lab_granted"})
        output = run.stdout + run.stderr
        assert run.returncode == 0, output[-3000:]
        assert f"rollout: batch 1/1: {pcie_host.name}\n" in run.stdout and "batch 2/" not in run.stdout
        assert "Not touched" not in output and f"[{b200_host.name}]" not in output  # never connected to it
        assert main_pid(pcie_host) != before[pcie_host.name]
        assert main_pid(b200_host) == before[b200_host.name]
        assert "SPECFLEET_LIMIT_TEST" not in fleet.ssh(b200_host, f"systemctl show -p Environment {SGLANG_UNIT}")
    finally:
        restored = run_deploy("--limit", pcie_host.name)
        assert restored.returncode == 0, restored.output[-3000:]


def test_status_prints_every_lab_host_in_one_table_fast_and_changes_nothing(deployed_lab, lab_hosts):
    started = time.monotonic()
    run = pyinfra("status.py")
    took = time.monotonic() - started
    assert run.returncode == 0, run.output[-3000:]
    lines = run.stdout.splitlines()
    assert lines[0].split()[:5] == ["host", "class", "deployment", "unit", "state"]
    for h in lab_hosts:
        row = next(line for line in lines if line.startswith(f"{h.name} "))
        assert SGLANG_UNIT in row and "active (running)" in row and "0.5.23+lab" in row, row
    assert took < STATUS_BUDGET_S, f"status.py took {took:.1f} s"
    print(f"status.py over {len(lab_hosts)} hosts: {took:.1f} s")
    records = json.loads(pyinfra("status.py", "--data", "json=true").stdout)
    assert {r["host"] for r in records} == {h.name for h in lab_hosts}
    assert all(r["accept_length"] > 0 and r["sglang"] == "0.5.23+lab" and len(r["weights"].split("+")) == 2
               for r in records)
    assert changed_operations(run_deploy().output) == []  # the lab is as it was (status ran no command that changes)


def test_logs_shows_a_replicas_journal_with_control_characters_escaped(deployed_lab, pcie_host):
    # A line in the replica's journal holding an escape sequence that would clear a terminal.
    fleet.ssh(pcie_host, "printf 'MESSAGE=specfleet-logs-test \\033[2J cleared\\nOBJECT_SYSTEMD_UNIT="
                         f"{SGLANG_UNIT}.service\\n' | logger --journald")
    run = pyinfra("logs.py", "--limit", pcie_host.name, "--data", f"replica={SGLANG_UNIT}", "--data", "lines=20")
    assert run.returncode == 0, run.output[-3000:]
    # pyinfra prints a command's output under the host's name, on stderr with its own lines.
    line = next(line for line in run.stderr.splitlines() if "specfleet-logs-test" in line)
    assert line.startswith(f"[{pcie_host.name}]") and "\\x1b[2J cleared" in line and "\x1b[2J" not in line
    assert len([line for line in run.stderr.splitlines() if line.startswith(f"[{pcie_host.name}]")]) <= 20
    # Followed, until stopped: lines go on coming.
    follow = subprocess.Popen([str(PYINFRA), LAB_INVENTORY, "logs.py", "--limit", pcie_host.name, "--data", "follow=true",
                               "--data", "lines=1"], cwd=REPO, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL,
                              stdin=subprocess.DEVNULL, text=True)
    try:
        time.sleep(5)
        fleet.ssh(pcie_host, "printf 'MESSAGE=specfleet-logs-followed\\nOBJECT_SYSTEMD_UNIT="
                             f"{SGLANG_UNIT}.service\\n' | logger --journald")
        deadline, seen = time.monotonic() + 20, ""
        while "specfleet-logs-followed" not in seen and time.monotonic() < deadline:
            seen += follow.stderr.readline()
        assert "specfleet-logs-followed" in seen
    finally:
        follow.terminate()
        follow.wait(10)
    refused = pyinfra("logs.py", "--limit", pcie_host.name, "--data", "replica=smg")
    assert refused.returncode == 1 and f"replica='smg' is no unit of {pcie_host.name}" in refused.output


# What the deploy laid down on a host and what an uninstall must not touch: accounts, their homes, directories.
LAID_DOWN = ("getent passwd sglang sglang-download postgres; ls -d /etc/specfleet /opt/specfleet /home/sglang "
             "/home/sglang-download /etc/specfleet-weights-peer 2>/dev/null; ls -lR /etc/ssl | md5sum; true")


@pytest.mark.parametrize("data, refusal", [
    ("service_user=postgres", "the account postgres has the login shell /bin/bash"),
    ("config_dir=/etc/ssl", "/etc/ssl holds no .specfleet, the mark the deploy writes in each directory it makes"),
])
def test_uninstall_refuses_an_account_or_directory_the_deploy_did_not_make_in_one_line_removing_nothing(
        deployed_lab, b200_host, data, refusal):
    # Debian's postgres account, as its package makes it: a system user with a login shell.
    fleet.ssh(b200_host, "getent passwd postgres >/dev/null || useradd --system --home-dir /var/lib/postgresql "
                         "--create-home --shell /bin/bash postgres")
    try:
        before, serving = fleet.ssh(b200_host, LAID_DOWN), main_pid(b200_host)
        run = pyinfra("-y", "uninstall.py", "--limit", b200_host.name, "--data", data)
        assert run.returncode == 1, run.output[-3000:]
        # Said once, in one line, as the deploy says a refusal (preflight.refuse).
        [line] = [line for line in run.output.splitlines() if line.strip().startswith(f"[{b200_host.name}] ")
                  and refusal in line]
        assert line.strip().startswith(f"[{b200_host.name}] {b200_host.name}: {refusal}") and \
            line.endswith("uninstall removes nothing" if "postgres" in data else "gets it from one deploy)")
        assert fleet.ssh(b200_host, LAID_DOWN) == before and main_pid(b200_host) == serving
    finally:
        fleet.ssh(b200_host, "userdel --remove postgres 2>/dev/null; true")


def test_uninstall_leaves_no_unit_user_or_key_and_the_next_deploy_converges(deployed_lab, pcie_host, b200_host):
    other, serving = main_pid(pcie_host), main_pid(b200_host)
    # Asked first (stdin closed: no answer), it lists what goes and says the weights stay, and changes nothing.
    asked = pyinfra("uninstall.py", "--limit", b200_host.name)
    assert "Remove every SGLang unit (sglang, sglang@*)" in asked.output, asked.output[-3000:]
    assert "the accounts sglang, sglang-download with their homes" in asked.output
    assert "the weights in /srv/specfleet/models stay (remove_weights=true removes them)" in asked.output
    assert asked.returncode != 0 and main_pid(b200_host) == serving != "0"
    # With the weights: their owner deletes them, so a file of root's beside them stays (and weights_dir too).
    fleet.ssh(b200_host, "touch /srv/specfleet/models/planted-by-root")
    run = pyinfra("-y", "uninstall.py", "--limit", b200_host.name, "--data", "remove_weights=true")
    assert run.returncode == 0, run.output[-3000:]
    assert fleet.ssh(b200_host, "ls -A /srv/specfleet/models").split() == ["planted-by-root"]
    fleet.ssh(b200_host, "rm /srv/specfleet/models/planted-by-root")
    # The download user's home holds the HF token: it goes with the user. Every account the deploy marked
    # goes; the fan-out's directory and its nginx (purged, then unmasked) too.
    left = fleet.ssh(b200_host, "ls /etc/systemd/system | grep -E '^(sglang|specfleet|smg|nginx)' ; getent passwd sglang; "
                                "getent passwd sglang-download; getent passwd | grep :specfleet: ; "
                                "ls -d /etc/specfleet /opt/specfleet /home/sglang /home/sglang-download "
                                "/etc/specfleet-weights-peer 2>/dev/null; dpkg -l 'nginx*' 2>/dev/null | grep ^ii; "
                                "systemctl list-units --all --plain --no-legend 'sglang*' 'specfleet-weights*'; true")
    assert left.strip() == "", left
    assert main_pid(pcie_host) == other  # another host is not touched
    again = pyinfra("-y", "uninstall.py", "--limit", b200_host.name)
    assert again.returncode == 0 and changed_operations(again.output) == []
    converged = run_deploy("--limit", b200_host.name)
    assert converged.returncode == 0, converged.output[-3000:]
    assert "serving DFLASH" in converged.output
    assert changed_operations(run_deploy("--limit", b200_host.name).output) == []


def test_behind_a_gateway_status_shows_membership_and_an_uninstalled_worker_leaves_the_gateway(lab_hosts):
    with behind_gateway(*EXPOSED, key=KEY, admin_key=ADMIN_KEY) as (hosts, first, _):
        assert first.returncode == 0, first.output[-3000:]
        workers = [h.name for h in hosts if h.host_class != "gateway"]
        started = time.monotonic()
        records = json.loads(pyinfra("status.py", "--data", "json=true").stdout)
        took = time.monotonic() - started
        assert took < STATUS_BUDGET_S, f"status.py took {took:.1f} s"
        print(f"status.py over {len(hosts)} hosts behind a gateway: {took:.1f} s")
        assert {r["host"]: r["gateway"] for r in records if r["host"] in workers} == dict.fromkeys(workers, "ready")
        gateway = next(r for r in records if r["class"] == "gateway")
        assert gateway["unit"] == "smg" and gateway["gateway"] == f"{len(workers)}/{len(workers)} workers healthy"
        removed = pyinfra("-y", "uninstall.py", "--limit", workers[0])
        assert removed.returncode == 0, removed.output[-3000:]
        records = json.loads(pyinfra("status.py", "--data", "json=true").stdout)
        mine = next(r for r in records if r["host"] == workers[0])
        assert mine["state"] == "not deployed" and mine["gateway"] == "absent"
        assert next(r for r in records if r["class"] == "gateway")["gateway"] == \
            f"{len(workers) - 1}/{len(workers) - 1} workers healthy"
        converged = run_deploy(*EXPOSED)
        assert converged.returncode == 0, converged.output[-3000:]
        records = json.loads(pyinfra("status.py", "--data", "json=true").stdout)
        assert {r["host"]: r["gateway"] for r in records if r["host"] in workers} == dict.fromkeys(workers, "ready")
