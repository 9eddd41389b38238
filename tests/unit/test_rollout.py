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


def batches(inventory, size: int) -> list[list[str]]:
    # In a process of its own: pyinfra's CLI module patches the process with gevent on import.
    return json.loads(subprocess.check_output(
        [sys.executable, "-c", f"import json, rollout; print(json.dumps(rollout.batches({str(inventory)!r}, {size})))"],
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
