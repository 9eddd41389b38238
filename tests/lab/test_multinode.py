"""One model over two lab nodes: lab-b200-1 (rank 0) and lab-b200-2 (rank 1) as the node group `lab-tp16`
(SPECFLEET_LAB_NODE_GROUP, lab/inventory.py), TP 16 over both.

The SGLang stand-in holds the real rendezvous (rank 0 serves only once rank 1 joined its dist-init port
over TCP, and goes down when rank 1 does), so a deploy that started or probed the nodes in the wrong
order would hang here. Afterwards lab-b200-2 is stopped and lab-b200-1 deployed back to serving alone.
"""

import subprocess
import sys
import time

import pytest

import lab
from lab import fleet
from lab.config import SUBNET
from tests.conftest import LAB_HOSTS
from tests.helpers import LAB_INVENTORY, REPO, SGLANG_UNIT, changed_operations, operations_started, run_deploy

pytestmark = pytest.mark.lab

NODES = "lab-b200-1,lab-b200-2"
LIMIT = ("--limit", "lab-b200-*")


def with_two_b200(spec: str) -> str:
    counts = dict(part.split("=") for part in spec.split(",") if part)
    counts["b200"] = str(max(2, int(counts.get("b200", 0))))
    return ",".join(f"{short}={count}" for short, count in counts.items())


@pytest.fixture(scope="module")
def group_lab(lab_hosts):
    """The two B200 hosts deployed as one server; the deploy's output."""
    hosts = {h.name: h for h in lab.up(with_two_b200(LAB_HOSTS), log=lambda line: None)}
    with pytest.MonkeyPatch.context() as env:
        env.setenv("SPECFLEET_LAB_NODE_GROUP", NODES)
        try:
            yield hosts, run_deploy(*LIMIT)
        finally:
            env.delenv("SPECFLEET_LAB_NODE_GROUP")
            lab.up(LAB_HOSTS, log=lambda line: None)
            alone = run_deploy("--limit", "lab-b200-1")
            assert alone.returncode == 0, alone.output[-3000:]


def group_checks() -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "tests/deployed/test_multinode.py", "--inventory", LAB_INVENTORY, "--limit", "lab-b200-*"],
                          cwd=REPO, capture_output=True, text=True, timeout=300)


def health(host) -> str:
    return fleet.ssh(host, "curl -s -o /dev/null -w '%{http_code}' -m 5 localhost:30000/health", check=False)


def test_the_group_comes_up_in_order_in_one_deploy(group_lab):
    hosts, deploy = group_lab
    assert deploy.returncode == 0, deploy.output[-4000:]
    started = operations_started(deploy.output)
    # Reachability before anything slow; rank 1 proven joined, then rank 0 serving for the group.
    assert started.index("Nodes reach rank 0") == started.index("Preflight") + 1
    assert started.index("Rank joined rank 0") < started.index(f"SGLang generates {SGLANG_UNIT}")
    assert "[lab-b200-2] rank 1 of lab-tp16 is up and joined rank 0" in deploy.output
    assert "[lab-b200-1] serving DFLASH" in deploy.output
    journal = fleet.ssh(hosts["lab-b200-1"], f"journalctl -u {SGLANG_UNIT} -o cat --no-pager _SYSTEMD_INVOCATION_ID="
                                            f"$(systemctl show -p InvocationID --value {SGLANG_UNIT})")
    assert journal.index("node rank 1 joined") < journal.index("fired up and ready"), journal[-2000:]
    # rank 1 serves only SGLang's dummy health server, no model
    assert health(hosts["lab-b200-2"]) == "200"
    assert fleet.ssh(hosts["lab-b200-2"], "curl -s -o /dev/null -w '%{http_code}' -m 5 localhost:30000/v1/models",
                     check=False) == "404"
    # Each rank's unit admits loopback and the other rank alone (docs/security.md: the lab does not enforce it).
    for this, other in (("lab-b200-1", "lab-b200-2"), ("lab-b200-2", "lab-b200-1")):
        allowed = fleet.ssh(hosts[this], f"systemctl show -P IPAddressAllow {SGLANG_UNIT}").split()
        assert sorted(allowed) == sorted(["127.0.0.0/8", "::1/128", f"{hosts[other].address}/32"]), (this, allowed)

    checks = group_checks()
    assert checks.returncode == 0 and "2 passed" in checks.stdout, checks.stdout[-3000:]
    again = run_deploy(*LIMIT)
    assert again.returncode == 0 and changed_operations(again.output) == [], again.output[-3000:]


def test_rank1_going_down_fails_the_groups_checks(group_lab):
    hosts, _ = group_lab
    rank0, rank1 = hosts["lab-b200-1"], hosts["lab-b200-2"]
    assert health(rank0) == "200"
    fleet.ssh(rank1, f"systemctl stop {SGLANG_UNIT}")
    deadline = time.monotonic() + 10
    while health(rank0) == "200" and time.monotonic() < deadline:
        time.sleep(0.5)
    assert health(rank0) != "200", "rank 0 kept serving after rank 1 went down"
    time.sleep(8)  # rank 0 restarted (Restart=always) and waits for rank 1: still not serving
    assert health(rank0) != "200"

    checks = group_checks()
    assert checks.returncode == 1 and "2 failed" in checks.stdout, checks.stdout[-3000:]
    assert "test_rank0_serves_for_its_group_with_every_rank_joined[lab-b200-1]" in checks.stdout
    assert "test_other_rank_is_up_and_joined_to_rank0[lab-b200-2]" in checks.stdout


def test_nodes_that_cannot_reach_rank0_fail_in_preflight_named_with_the_fix(group_lab):
    """A dist-init address no node has (node_address given wrong): both ends fail, named, before anything slow."""
    hosts, _ = group_lab
    pids = {name: fleet.ssh(host, f"systemctl show -p MainPID --value {SGLANG_UNIT}").strip() for name, host in hosts.items()
            if name in NODES}
    wrong = f"{SUBNET}.2.99"  # on the lab network, no host's
    broken = run_deploy(*LIMIT, "--data", f"node_address={wrong}")
    assert broken.returncode != 0
    assert (f"lab-b200-1: rank 0 of node group lab-tp16 cannot open its dist-init port {wrong}:25000 ({wrong} is "
            "not an address of this host): set node_address of lab-b200-1") in broken.output, broken.output[-3000:]
    assert "[lab-b200-2] lab-b200-2: rank 1 of node group lab-tp16 " in broken.output, broken.output[-3000:]
    started = operations_started(broken.output)
    assert started[-1] == "Nodes reach rank 0", started  # nothing after it ran
    assert {name: fleet.ssh(hosts[name], f"systemctl show -p MainPID --value {SGLANG_UNIT}").strip() for name in pids} == pids
