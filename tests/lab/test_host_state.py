"""One round trip for a host's whole state (operations/host_state.py): on real lab hosts the host
program answers every fact as that fact's own command does, and a no-op re-run sends one command."""

import json
import os
import re
import subprocess
from collections import Counter

import pytest

from tests.helpers import LAB_INVENTORY, PYINFRA, REPO, results_table, run_deploy

pytestmark = pytest.mark.lab


def without_free(value):
    """VALUE less what moves between two reads: free bytes on a disk other labs share."""
    if isinstance(value, dict):
        return {k: without_free(v) for k, v in value.items() if k != "free"}
    return value


def comparable(row: dict, which: str):
    return without_free(row[which]) if row["fact"].startswith("Weights") else row[which]


def test_the_host_program_answers_every_fact_as_its_own_command(deployed_lab, lab_hosts, tmp_path):
    result = subprocess.run([str(PYINFRA), "-y", LAB_INVENTORY, "tests/lab/host_state_check.py", "--data",
                             f"host_state_out={tmp_path}"], cwd=REPO, capture_output=True, text=True,
                            env={**os.environ, "HF_TOKEN": "hf_lab_granted"}, timeout=300)
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    for lab_host in lab_hosts:
        rows = json.loads((tmp_path / f"{lab_host.name}.json").read_text())
        assert {row["fact"] for row in rows} >= {"NvidiaGpus", "NvidiaFabric", "FileStates", "UserFileStates",
                                                 "VenvRequirement", "WeightsOnDisk", "WeightsState", "WeightsDisk",
                                                 "ServiceState", "ServerProbe"}
        unanswered = [row["fact"] for row in rows if not row["answered"]]
        assert not unanswered, f"{lab_host.name}: the host program left {unanswered} to their own commands"
        for row in rows:
            assert comparable(row, "gathered") == comparable(row, "own_command"), \
                f"{lab_host.name} {row['fact']} {row['arguments']}"


def test_a_no_op_re_run_sends_each_host_one_command(deployed_lab, lab_hosts):
    result = run_deploy("--debug")
    assert result.returncode == 0, result.output[-3000:]
    assert not any(row[1] not in ("-", "0") for row in results_table(result.output).values()), result.output[-3000:]
    commands = Counter(re.findall(r"\[pyinfra\.connectors\.ssh\] Running command on (\S+?):", result.output))
    assert commands == {h.name: 1 for h in lab_hosts}, commands
