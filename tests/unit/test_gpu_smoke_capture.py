"""Replay of the real GPU smoke test on a 2x H200 NVLink host (tests/fixtures/nvidia-smi/h200-x2-smoke):
the deploy's operation ran there through pyinfra @local; the controller must judge, print and
skip exactly as it did there, and the class floors must separate what NVLink and a PCIe path gave."""

import json
import re
import sys
from pathlib import Path

import pytest

from operations.gpu.smoke import GpuSmokeRecord, summary
from tests.helpers import host_programs_importable
from tests.unit.group_data import class_expectations

REPO = Path(__file__).resolve().parents[2]
CAPTURE = REPO / "tests" / "fixtures" / "nvidia-smi" / "h200-x2-smoke"
host_programs_importable()
import gpu_smoke  # noqa: E402  (a host script: plain module, no package)


def record_in(file_name: str) -> dict:
    """The JSON record a capture file holds (the host script prints it as one line)."""
    lines = [line for line in (CAPTURE / file_name).read_text().splitlines() if line.startswith("{")]
    return json.loads(lines[-1])


def judged_again(record: dict, floor_gbps: float | None = None) -> dict:
    """The host script's verdict on the recorded timings, computed here."""
    measurement = {key: record[key] for key in ("engine", "torch", "nccl")}
    measurement["results"] = [{key: result[key] for key in ("bytes", "seconds", "correct")} for result in record["results"]]
    base = {key: record[key] for key in ("gpus", "driver_version", "boot_id", "floor_gbps", "timeout_s", "key",
                                         "measured_at", "seconds")}
    if floor_gbps is not None:
        base["floor_gbps"] = floor_gbps
    return gpu_smoke.judge(dict(base, results=[]), measurement, "")


def class_floor(class_name: str) -> float:
    return class_expectations(class_name).allreduce_floor_gbps


def test_the_recorded_pass_is_judged_the_same_here():
    record = json.loads((CAPTURE / "record.json").read_text())
    assert judged_again(record) == record
    assert (record["verdict"], record["gpus"], record["driver_version"], record["nccl"]) == ("passed", 2, "580.159.04", "2.28.9")
    assert [result["bytes"] >> 20 for result in record["results"]] == [1, 16, 128, 512]
    assert record["busbw_gbps"] == 312.99


def test_what_pyinfra_printed_there_is_the_summary_of_the_record():
    record = json.loads((CAPTURE / "record.json").read_text())
    printed = (CAPTURE / "pyinfra-run1.txt").read_text()
    assert f"[@local] {summary(record)}\n    [@local] Success" in printed
    assert re.search(r"GPU smoke test\s+1\s+1\s+-\s+-", printed)


def test_the_second_run_changed_nothing_and_the_fact_says_why():
    record_line = (CAPTURE / "record.json").read_text().strip()
    assert re.search(r"GPU smoke test\s+1\s+-\s+-\s+1", (CAPTURE / "pyinfra-run2.txt").read_text())
    fact = GpuSmokeRecord().process([json.loads(record_line)["boot_id"], record_line])
    assert fact["record"]["verdict"] == "passed" and fact["record"]["boot_id"] == fact["boot_id"]


def test_a_pcie_path_on_the_nvlink_pair_fails_the_nvlink_floor_and_passes_the_pcie_one():
    record = record_in("p2p-disabled.txt")
    assert judged_again(record) == record
    assert record["verdict"] == "failed" and "27.17 GB/s at 512 MiB is below the class's floor of 150" in record["reason"]
    assert judged_again(record, class_floor("rtx_pro_6000_pcie"))["verdict"] == "passed"
    assert "rc=1" in (CAPTURE / "p2p-disabled.txt").read_text()


@pytest.mark.parametrize("class_name", ["b200_nvlink", "b300_nvlink"])
def test_the_nvlink_floor_lies_between_the_real_pcie_path_and_nvlink(class_name):
    nvlink, pcie_path = json.loads((CAPTURE / "record.json").read_text()), record_in("p2p-disabled.txt")
    # Margins both ways: a slower NVLink board still passes, a faster PCIe path still fails.
    assert 2 * pcie_path["busbw_gbps"] < class_floor(class_name) < nvlink["busbw_gbps"] / 2 + 1


def test_the_timeout_killed_the_workers_and_failed():
    record = record_in("timeout-2s.txt")
    assert record["verdict"] == "failed" and record["reason"].startswith("the all-reduce did not finish within 2 s")
    text = (CAPTURE / "timeout-2s.txt").read_text()
    assert re.search(r"real\t0m2\.\d+s", text) and text.rstrip().endswith("left over processes:\n0")


def test_capture_metadata():
    case = json.loads((CAPTURE / "case.json").read_text())
    assert sorted(case["files"]) == sorted(path.name for path in CAPTURE.iterdir() if path.name != "case.json")
    assert case["busbw_gbps"] == {"nvlink": 312.99, "nccl_p2p_disabled": 27.17}
    env = (CAPTURE / "env.txt").read_text()
    assert "580.159.04" in env and "2.11.0+cu130 (2, 28, 9) 2" in env
    uuids = re.findall(r"GPU-[0-9a-f-]+", (CAPTURE / "probes.txt").read_text())
    assert uuids == ["GPU-00000000-0000-0000-0000-000000000000", "GPU-00000001-0000-0000-0000-000000000001"]
