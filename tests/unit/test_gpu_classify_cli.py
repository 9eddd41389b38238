"""`python -m operations.gpu classify DIR` in a subprocess, on every real capture."""

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
}


def classify(capture_dir):
    return subprocess.run(
        [sys.executable, "-m", "operations.gpu", "classify", str(capture_dir)],
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
        gpu_name=None, gpu_count=8, memory_total_mib=None, driver_version=None, compute_capability=None,
        interconnect="nvlink", degraded=False, host_class="unknown",
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
