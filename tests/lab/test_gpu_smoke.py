"""The GPU smoke test in the deploy: an NVLink board whose all-reduce runs at PCIe speed (topo -m
still reads NV18 everywhere) stops the deploy before weights and unit, and leaves SGLang as it was;
a PCIe host decides peer-to-peer by measuring it: one whose P2P hangs is served with P2P off and
says so, one whose P2P works keeps it."""

import json
import re
import time

import pytest

from lab import fleet
from deployment.hosts import resolve
from tests.helpers import (ENV_FILE, UNIT_FILE, main_pid, operations_started, results_table, run_deploy,
                           server_info)
from tests.unit.group_data import host_data

pytestmark = pytest.mark.lab


def record_path(lab_host) -> str:
    return resolve(host_data(lab_host.host_class, lab=True), lab_host.host_class).host.smoke.record_path


def test_nvlink_at_pcie_speed_fails_the_smoke_test_before_weights_and_unit(deployed_lab, b200_host):
    record = record_path(b200_host)
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
    # The host-memory path's 27.17 GB/s at 512 MiB, as the lab's torch times it.
    assert re.search(rf"\[{b200_host.name}\] GPU smoke test failed: 8 GPUs, all-reduce bus bandwidth GB/s 1 MiB [\d.]+, "
                     r"16 MiB [\d.]+, 128 MiB [\d.]+, 512 MiB 2[0-7][.\d]* \(floor 150\)", result.output), \
        result.output[-3000:]
    assert re.search(r"bus bandwidth 2[0-7][.\d]* GB/s at 512 MiB is below the class's floor of 150 GB/s", result.output)
    assert operations_started(result.output)[-1] == "GPU smoke test"  # no weights, no unit after it
    assert fleet.ssh(b200_host, f"sha1sum {UNIT_FILE}") == unit_before
    assert main_pid(b200_host) == pid_before
    assert failed["verdict"] == "failed" and 20 < failed["busbw_gbps"] <= 27.17
    again = run_deploy("--limit", b200_host.name)  # the board is fine again: tested again, passes
    assert again.returncode == 0, again.output[-3000:]
    assert f"[{b200_host.name}] GPU smoke test passed" in again.output
    assert json.loads(fleet.ssh(b200_host, f"cat {record}"))["verdict"] == "passed"


def test_a_pcie_host_whose_p2p_hangs_is_served_with_p2p_off_and_one_whose_p2p_works_keeps_it(deployed_lab, pcie_host):
    record = record_path(pcie_host)
    fleet.set_gpu_profile(pcie_host, "rtx_pro_6000_pcie_p2p_hang")
    fleet.ssh(pcie_host, f"rm -f {record}")  # a host not measured yet
    try:
        started = time.monotonic()
        hung = run_deploy("--limit", pcie_host.name)
        deploy_s = time.monotonic() - started
        off = json.loads(fleet.ssh(pcie_host, f"cat {record}"))
        env_off = fleet.ssh(pcie_host, f"cat {ENV_FILE}")
        served_off = server_info(pcie_host)
        quiet = run_deploy("--limit", pcie_host.name)
    finally:
        fleet.set_gpu_profile(pcie_host, "rtx_pro_6000_pcie")
        fleet.ssh(pcie_host, f"rm -f {record}")  # P2P is tried again only once its record is gone
    assert hung.returncode == 0, hung.output[-3000:]
    p2p = off["p2p"]
    print(f"\nP2P hang host: decided off in {p2p['trial']['seconds']} s (the bounded P2P attempt), all-reduce without "
          f"P2P {off['busbw_gbps']} GB/s at 512 MiB, smoke test {off['seconds']} s, deploy {deploy_s:.0f} s")
    assert (p2p["enabled"], p2p["decided_by"]) == (False, "measurement")
    assert p2p["reason"] == "the P2P all-reduce hung (no result within 20 s)"  # a third of gpu_smoke_timeout_s
    assert off["verdict"] == "passed" and 20 < off["busbw_gbps"] <= 27.17 and off["ran_as"] == "sglang"
    # Served with P2P off: in the unit's environment, the server generating, and the deploy says so in one line.
    assert "\nNCCL_P2P_DISABLE=1\n" in env_off and served_off["speculative_algorithm"] == "DFLASH"
    assert (f"[{pcie_host.name}] NCCL P2P off on this host: the P2P all-reduce hung (no result within 20 s); likely "
            "PCIe ACS or the IOMMU routing peer-to-peer traffic through the CPU") in hung.output, hung.output[-3000:]
    assert f"then remove {record} and deploy again to try P2P again" in hung.output
    # A re-run changes nothing, and says it again.
    assert quiet.returncode == 0 and not any(row[1] not in ("-", "0") for row in results_table(quiet.output).values())
    assert f"[{pcie_host.name}] NCCL P2P off on this host" in quiet.output

    works = run_deploy("--limit", pcie_host.name)  # the working board, measured afresh: P2P kept
    assert works.returncode == 0, works.output[-3000:]
    kept = json.loads(fleet.ssh(pcie_host, f"cat {record}"))
    print(f"P2P working host: kept, all-reduce with P2P {kept['busbw_gbps']} GB/s at 512 MiB (floor "
          f"{kept['p2p']['floor_gbps']:g}), decided in {kept['p2p']['trial']['seconds']} s")
    assert (kept["p2p"]["enabled"], kept["p2p"]["decided_by"]) == (True, "measurement")
    assert kept["busbw_gbps"] > kept["p2p"]["floor_gbps"] == 30
    assert "NCCL_P2P_DISABLE" not in fleet.ssh(pcie_host, f"cat {ENV_FILE}")
    assert "NCCL P2P off" not in works.output and server_info(pcie_host)["speculative_algorithm"] == "DFLASH"
