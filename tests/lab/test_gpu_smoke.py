"""The GPU smoke test in the deploy: an NVLink board whose all-reduce runs at PCIe speed (topo -m
still reads NV18 everywhere) stops the deploy before weights and unit, and leaves SGLang as it was."""

import json

import pytest

from lab import fleet
from operations.deployment import resolve
from tests.helpers import UNIT_FILE, main_pid, operations_started, run_deploy
from tests.unit.group_data import host_data

pytestmark = pytest.mark.lab


def test_nvlink_at_pcie_speed_fails_the_smoke_test_before_weights_and_unit(deployed_lab, b200_host):
    record = resolve(host_data(b200_host.host_class, lab=True), b200_host.host_class).smoke.record_path
    unit_before = fleet.ssh(b200_host, f"sha1sum {UNIT_FILE}")
    pid_before = main_pid(b200_host)
    fleet.set_gpu_profile(b200_host, "b200_nvlink_slow_allreduce")
    fleet.ssh(b200_host, f"rm {record}")  # as on a host not tested yet (the record holds for a boot)
    try:
        result = run_deploy("--limit", b200_host.name)
        failed = json.loads(fleet.ssh(b200_host, f"cat {record}"))
    finally:
        fleet.set_gpu_profile(b200_host, "b200_nvlink")
    assert result.returncode != 0
    assert (f"[{b200_host.name}] GPU smoke test failed: 8 GPUs, all-reduce bus bandwidth GB/s 1 MiB 14.69, "
            "16 MiB 26.33, 128 MiB 27.14, 512 MiB 27.17 (floor 150)") in result.output, result.output[-3000:]
    assert "27.17 GB/s at 512 MiB is below the class's floor of 150 GB/s" in result.output
    assert operations_started(result.output)[-1] == "GPU smoke test"  # no weights, no unit after it
    assert fleet.ssh(b200_host, f"sha1sum {UNIT_FILE}") == unit_before
    assert main_pid(b200_host) == pid_before
    assert failed["verdict"] == "failed" and failed["busbw_gbps"] == 27.17
    again = run_deploy("--limit", b200_host.name)  # the board is fine again: tested again, passes
    assert again.returncode == 0, again.output[-3000:]
    assert f"[{b200_host.name}] GPU smoke test passed" in again.output
    assert json.loads(fleet.ssh(b200_host, f"cat {record}"))["verdict"] == "passed"
