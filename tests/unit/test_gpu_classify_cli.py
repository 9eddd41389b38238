"""`python -m tools.gpu classify DIR` in a subprocess, on every real capture."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CAPTURES = REPO / "tests" / "fixtures" / "nvidia-smi"
FIELDS = ["gpu_name", "gpu_count", "memory_total_mib", "driver_version", "compute_capability", "interconnect", "degraded"]
HOST_CLASS = {
    "b200-8x-nvlink": "b200_nvlink",
    "rtxpro6000se-8x-pcie": "rtx_pro_6000_pcie",
    "h200-x2-nvlink": "unknown",
    # Real outputs of the two kinds classify used to miss (the case.json says where each is from):
    "h100-8x-nvlink-topo-rows-only": "unknown",  # topo -m without its header row: NVLink from the rows
    "rtxpro6000se-8x-query-only": "rtx_pro_6000_pcie",  # --query-gpu only: PCIe by product
    # Shapes of real output classify read wrong (each folder's README says where its text comes from):
    "h200-x2-query-noheader": "unknown",  # --format=csv,noheader: the first GPU is no header
    "mixed-rtx5090-rtx3090ti": "unknown",  # two GPU models: both reported, no class
    "a100-80gb-x2-mig": "unknown",  # MIG enabled: the card's memory, not the MIG devices table's slices
    "nvml-driver-library-mismatch": "unknown",  # nvidia-smi exits 18: unknown, with why and what to do
    "driver-not-loaded": "unknown",  # nvidia-smi exits 9
}
SHAPES = ["h200-x2-query-noheader", "mixed-rtx5090-rtx3090ti", "a100-80gb-x2-mig", "nvml-driver-library-mismatch",
          "driver-not-loaded"]


def classify(capture_dir):
    return subprocess.run(
        [sys.executable, "-m", "tools.gpu", "classify", str(capture_dir)],
        cwd=REPO, capture_output=True, text=True,
    )


@pytest.mark.parametrize("case", sorted(HOST_CLASS))
def test_classify_matches_case_json(case):
    result = classify(CAPTURES / case)
    assert result.returncode == 0, result.stderr
    found = json.loads(result.stdout)
    expected = json.loads((CAPTURES / case / "case.json").read_text())
    assert {field: found[field] for field in FIELDS} == {field: expected[field] for field in FIELDS}
    assert found["host_class"] == HOST_CLASS[case]


def test_rtx_name_comes_from_q_not_the_table(tmp_path):
    # The plain table truncates the name; with -q beside it the full name wins.
    (tmp_path / "smi.txt").write_text(
        "| NVIDIA-SMI 595.58.03      Driver Version: 595.58.03      CUDA Version: 13.2     |\n"
        "|   0  NVIDIA RTX PRO 6000 Blac...    On  |   00000000:06:00.0 Off |                    0 |\n"
    )
    assert json.loads(classify(tmp_path).stdout)["gpu_name"] is None
    (tmp_path / "smi_q.txt").write_bytes((CAPTURES / "rtxpro6000se-8x-pcie" / "smi_q.txt").read_bytes())
    assert json.loads(classify(tmp_path).stdout)["gpu_name"] == "NVIDIA RTX PRO 6000 Blackwell Server Edition"


def test_topology_alone_leaves_unknown_fields_null(tmp_path):
    (tmp_path / "topo.txt").write_bytes((CAPTURES / "b200-8x-nvlink" / "topo.txt").read_bytes())
    found = json.loads(classify(tmp_path).stdout)
    assert found == dict(
        gpu_name=None, gpu_models=None, gpu_count=8, memory_total_mib=None, driver_version=None,
        compute_capability=None, mig_mode=None, interconnect="nvlink", degraded=False, host_class="unknown",
    )


def test_no_readable_file_exits_non_zero(tmp_path):
    result = classify(tmp_path)
    assert result.returncode != 0
    assert "no readable capture" in result.stderr
    assert result.stdout == ""


def test_a_broken_file_is_skipped_when_another_reads(tmp_path):
    (tmp_path / "q.xml").write_text("<nvidia_smi_log><gpu>")  # cut short
    assert classify(tmp_path).returncode != 0
    (tmp_path / "topo.txt").write_bytes((CAPTURES / "h200-x2-nvlink" / "topo.txt").read_bytes())
    result = classify(tmp_path)
    assert result.returncode == 0 and json.loads(result.stdout)["interconnect"] == "nvlink"


def test_rows_without_header_still_show_a_degraded_board(tmp_path):
    # The lab's degraded B200 (the real capture, GPU3's NVLinks cut), its header row dropped.
    topology = (REPO / "lab" / "gpu_standin" / "profiles" / "b200_nvlink_degraded" / "topo.txt").read_text()
    (tmp_path / "topo.txt").write_text(topology.split("\n", 1)[1])
    found = json.loads(classify(tmp_path).stdout)
    assert (found["gpu_count"], found["interconnect"], found["degraded"]) == (8, "unknown", True)
    (tmp_path / "topo.txt").write_text(topology)
    assert json.loads(classify(tmp_path).stdout) == found


def test_product_knowledge_only_where_no_topology_was_read(tmp_path):
    # H200s may have NVLink or not: their names alone say nothing.
    (tmp_path / "query.csv").write_bytes((CAPTURES / "h200-x2-nvlink" / "query.csv").read_bytes())
    assert (json.loads(classify(tmp_path).stdout)["interconnect"], json.loads(classify(tmp_path).stdout)["degraded"]) == (None, None)
    # RTX PRO 6000 cards have none; a topology read wins over the product (a 1-GPU matrix has no pair).
    (tmp_path / "query.csv").write_bytes((CAPTURES / "rtxpro6000se-8x-query-only" / "query.csv").read_bytes())
    assert json.loads(classify(tmp_path).stdout)["interconnect"] == "pcie"
    (tmp_path / "topo.txt").write_text("\tGPU0\tCPU Affinity\nGPU0\t X \t0-31\n")
    assert json.loads(classify(tmp_path).stdout)["interconnect"] == "unknown"


@pytest.mark.parametrize("case", SHAPES)
def test_each_shape_of_real_output_reads_as_its_case_says(case):
    found = json.loads(classify(CAPTURES / case).stdout)
    expected = json.loads((CAPTURES / case / "case.json").read_text())
    for field in [*FIELDS, "gpu_models", "mig_mode", "host_class"]:
        assert found[field] == expected[field], field
    assert (CAPTURES / case / "README.md").is_file()
    assert sorted(expected["files"]) == sorted(path.name for path in (CAPTURES / case).iterdir())


def test_a_header_less_csv_keeps_every_gpu_and_its_name():
    found = json.loads(classify(CAPTURES / "h200-x2-query-noheader").stdout)
    assert (found["gpu_count"], found["gpu_name"], found["memory_total_mib"]) == (2, "NVIDIA H200", 143771)


def test_two_gpu_models_are_both_reported_and_fit_no_class():
    found = json.loads(classify(CAPTURES / "mixed-rtx5090-rtx3090ti").stdout)
    assert [model["name"] for model in found["gpu_models"]] == ["NVIDIA GeForce RTX 5090", "NVIDIA GeForce RTX 3090 Ti"]
    assert (found["gpu_name"], found["compute_capability"], found["host_class"]) == ("mixed", "mixed", "unknown")


def test_mig_reports_the_cards_memory_and_the_mode():
    found = json.loads(classify(CAPTURES / "a100-80gb-x2-mig").stdout)
    assert (found["memory_total_mib"], found["mig_mode"]) == (81920, "Enabled")


@pytest.mark.parametrize("case, code, fix", [
    ("nvml-driver-library-mismatch", 18, "reboot the host so the installed driver's module loads"),
    ("driver-not-loaded", 9, "install the driver (open kernel module) and reboot"),
])
def test_a_failing_nvidia_smi_leaves_the_gpus_unknown_and_says_why(case, code, fix):
    found = json.loads(classify(CAPTURES / case).stdout)
    assert {found[field] for field in FIELDS} == {"unknown"}  # not zero GPUs, not nulls
    failed = found["nvidia_smi_failed"]
    expected = json.loads((CAPTURES / case / "case.json").read_text())["nvidia_smi_failed"]
    assert (failed["exit_code"], failed["message"]) == (expected["exit_code"], expected["message"]) == (
        code, expected["message"])
    assert fix in failed["fix"] and failed["cause"]
