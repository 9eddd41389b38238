"""rollout.py's plan, from a real inventory file read as pyinfra reads it: batches of units."""

import json
import subprocess
import sys

from tests.helpers import REPO

INVENTORY = '''
b200_nvlink = [
    ("b200-1", {"node_group": "kimi-tp16", "node_rank": 0}),
    ("b200-solo", {}),
    ("b200-2", {"node_group": "kimi-tp16", "node_rank": 1}),
]
rtx_pro_6000_pcie = ["pcie-1", "pcie-2"]
gateway = ["gw-1", "pcie-1"]
'''


def batches(inventory, size: int, limit: list[str] = ()) -> list[list[str]]:
    # In a process of its own: pyinfra's CLI module patches the process with gevent on import.
    call = f"rollout.batches({str(inventory)!r}, {size}, {list(limit)!r})"
    return json.loads(subprocess.check_output(
        [sys.executable, "-c", f"import json, rollout; print(json.dumps({call}))"],
        cwd=REPO, text=True))


def test_a_node_group_is_one_unit_of_a_batch_and_gateway_only_hosts_come_last(tmp_path):
    inventory = tmp_path / "fleet.py"
    inventory.write_text(INVENTORY)
    one_at_a_time = batches(inventory, 1)
    # Both ranks of the group in one run, wherever they sit in the inventory; the GPU host that
    # also runs a gateway is a worker; the gateway-only host has the last run to itself.
    assert sorted(map(sorted, one_at_a_time[:-1])) == [["b200-1", "b200-2"], ["b200-solo"], ["pcie-1"], ["pcie-2"]]
    assert one_at_a_time[-1] == ["gw-1"]
    two_at_a_time = batches(inventory, 2)
    assert len(two_at_a_time) == 3 and two_at_a_time[-1] == ["gw-1"]
    assert any({"b200-1", "b200-2"} <= set(batch) and len(batch) == 3 for batch in two_at_a_time)


def rolled(inventory, *args: str, stdin: str = "") -> tuple[subprocess.CompletedProcess, list[list[str]]]:
    """rollout.main(ARGS) with each batch's pyinfra run recorded instead of run: (its output, the runs)."""
    driver = (
        "import json, subprocess, sys, types, rollout\n"
        "runs = []\n"
        # rollout's own module handle: pyinfra's CLI patches the subprocess module itself (gevent) on import.
        "rollout.subprocess = types.SimpleNamespace(run=lambda command, **_: runs.append(command[3:])\n"
        "                                          or subprocess.CompletedProcess(command, 0))\n"
        f"code = rollout.main([{str(inventory)!r}, *{list(args)!r}])\n"
        "print('RUNS', json.dumps(runs))\n"
        "sys.exit(code)\n")
    run = subprocess.run([sys.executable, "-c", driver], cwd=REPO, text=True, capture_output=True, input=stdin)
    runs = json.loads(run.stdout.split("RUNS ", 1)[1]) if "RUNS " in run.stdout else []
    return run, runs


def limits(command: list[str]) -> list[str]:
    return [command[i + 1] for i, word in enumerate(command) if word == "--limit"]


def test_limit_narrows_the_hosts_batched_and_each_run_is_limited_to_its_batch_alone(tmp_path):
    inventory = tmp_path / "fleet.py"
    inventory.write_text(INVENTORY)
    assert batches(inventory, 1, ["pcie-2"]) == [["pcie-2"]]
    assert batches(inventory, 1, ["gateway"]) == [["pcie-1"], ["gw-1"]]  # a group, as pyinfra matches it
    assert batches(inventory, 1, ["pcie-*"]) == [["pcie-1"], ["pcie-2"]]  # a glob
    run, runs = rolled(inventory, "--limit", "pcie-*", "--data", "longest_generation_s=1200")
    assert run.returncode == 0, run.stderr
    # One run per batch, limited to that batch only; the user's other options passed on.
    assert [limits(command) for command in runs] == [["pcie-1"], ["pcie-2"]]
    assert all(command[-2:] == ["--data", "longest_generation_s=1200"] for command in runs)
    assert "batch 1/2: pcie-1" in run.stdout and "batch 2/2: pcie-2" in run.stdout
    run, runs = rolled(inventory, "--exclude", "b200-*", "--exclude", "gw-1")
    assert [limits(command) for command in runs] == [["pcie-1"], ["pcie-2"]]


def test_a_limit_taking_part_of_a_node_group_or_no_host_is_refused_before_any_run(tmp_path):
    inventory = tmp_path / "fleet.py"
    inventory.write_text(INVENTORY)
    run, runs = rolled(inventory, "--limit", "b200-1")
    assert run.returncode == 2 and runs == []
    assert "node group kimi-tp16 is deployed whole: the selection leaves out b200-2" in run.stderr
    run, runs = rolled(inventory, "--limit", "b200-1", "--limit", "b200-2")
    assert run.returncode == 0 and [limits(command) for command in runs] == [["b200-1", "b200-2"]]
    run, runs = rolled(inventory, "--limit", "nothing-here")
    assert run.returncode == 2 and runs == [] and "no host selected" in run.stderr


def test_a_rollout_that_may_install_a_driver_asks_first_unless_yes(tmp_path):
    inventory = tmp_path / "fleet.py"
    inventory.write_text(INVENTORY)
    asked = ("--limit", "pcie-*", "--data", "install_driver=true")
    run, runs = rolled(inventory, *asked)  # no answer (stdin closed): nothing runs
    assert run.returncode == 1 and runs == []
    assert "install_driver is on for pcie-1, pcie-2" in run.stderr and "Press enter" in run.stderr
    run, runs = rolled(inventory, *asked, stdin="\n")
    assert run.returncode == 0 and len(runs) == 2
    run, runs = rolled(inventory, *asked, "-y")
    assert run.returncode == 0 and len(runs) == 2 and "Press enter" not in run.stderr
    run, runs = rolled(inventory, "--limit", "pcie-*")  # install_driver off (group_data/all.py): no question
    assert run.returncode == 0 and len(runs) == 2 and "Press enter" not in run.stderr
