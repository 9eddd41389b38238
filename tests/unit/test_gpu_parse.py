"""operations.gpu.parse (and tools.gpu.smi_captures, what only captures hold) on the real captures in tests/fixtures/nvidia-smi, plus edge cases."""

import json
from pathlib import Path

import pytest

from operations.gpu.parse import parse_proc_driver_version, parse_query_csv, parse_smi_q, parse_topology
from tools.gpu import smi_captures
from tools.gpu.smi_captures import parse_smi_table, parse_smi_xml

CAPTURES = Path(__file__).resolve().parents[1] / "fixtures" / "nvidia-smi"


def lines(case, file_name):
    return (CAPTURES / case / file_name).read_text().splitlines()


@pytest.mark.parametrize(
    "case, file_name",
    [
        ("b200-8x-nvlink", "topo.txt"),  # glued cells: 'PXBNODE', 'SYSSYS', ' X NODE'
        ("b200-8x-nvlink", "topo_normalized.txt"),
        ("rtxpro6000se-8x-pcie", "topo.txt"),  # ANSI header, empty affinity cells
        ("h200-x2-nvlink", "topo.txt"),
    ],
)
def test_topology_matches_case(case, file_name):
    expected = json.loads((CAPTURES / case / "case.json").read_text())
    topology = parse_topology(lines(case, file_name))
    assert len(topology["gpus"]) == expected["gpu_count"]
    assert topology["interconnect"] == expected["interconnect"]
    assert topology["degraded"] is expected["degraded"]
    n = expected["gpu_count"]
    assert len(topology["links"]) == n * (n - 1) // 2
    assert None not in topology["links"].values()


def test_glued_cells_read_like_the_normalized_capture():
    assert parse_topology(lines("b200-8x-nvlink", "topo.txt")) == parse_topology(
        lines("b200-8x-nvlink", "topo_normalized.txt")
    )


def test_pcie_paths_kept_per_pair():
    links = parse_topology(lines("rtxpro6000se-8x-pcie", "topo.txt"))["links"]
    assert (links["0-1"], links["0-2"], links["0-4"], links["6-7"]) == ("PIX", "NODE", "SYS", "PIX")


SPACES_TOPOLOGY = """\
        GPU0    GPU1    GPU2    NIC0    CPU Affinity    NUMA Affinity
GPU0     X      NV12    SYS     PXB     0-15            0
GPU1    NV12     X      SYS     SYS     0-15            0
GPU2    SYS     SYS      X      SYS                     1
NIC0    PXB     SYS     SYS      X
"""


def test_runs_of_spaces_nic_columns_and_a_pcie_only_gpu_make_a_degraded_board():
    topology = parse_topology(SPACES_TOPOLOGY.splitlines())
    assert topology["links"] == {"0-1": "NV12", "0-2": "SYS", "1-2": "SYS"}
    assert topology["interconnect"] == "unknown"
    assert topology["degraded"] is True
    assert topology["gpus_without_nvlink"] == [2]


def test_short_row_is_filled_from_the_transposed_cell():
    text = "\tGPU0\tGPU1\tGPU2\tCPU Affinity\nGPU0\t X \tNV4\tNV4\t0-7\nGPU1\tNV4\t X \nGPU2\tNV4\tNV4\t X \t0-7\n"
    topology = parse_topology(text.splitlines())
    assert topology["links"] == {"0-1": "NV4", "0-2": "NV4", "1-2": "NV4"}
    assert topology["interconnect"] == "nvlink"


def test_single_gpu_has_no_pair_so_interconnect_is_unknown_not_degraded():
    topology = parse_topology(["\tGPU0\tCPU Affinity\tNUMA Affinity", "GPU0\t X \t0-31\t0"])
    assert topology == dict(gpus=[0], links={}, interconnect="unknown", degraded=False, gpus_without_nvlink=[])


def test_no_topology_output():
    assert parse_topology(["Failed to initialize NVML: Driver/library version mismatch"])["gpus"] == []


def test_query_csv_with_header_in_any_order():
    gpus = smi_captures.parse_query_csv(lines("h200-x2-nvlink", "query.csv"))
    assert len(gpus) == 2
    assert gpus[1] == dict(
        index=1, name="NVIDIA H200", uuid="GPU-00000001-0000-0000-0000-000000000001",
        pci_bus_id="00000000:00:07.0", driver_version="580.159.04", memory_total_mib=143771,
        persistence_mode="Enabled", compute_capability="9.0",
    )


def test_query_csv_noheader_nounits_and_not_applicable_values():
    fields = ["index", "name", "memory.total", "mig.mode.current"]
    output = ["0, NVIDIA RTX PRO 6000 Blackwell Server Edition, 97887, [N/A]"]
    assert parse_query_csv(output, fields) == [
        dict(index=0, name="NVIDIA RTX PRO 6000 Blackwell Server Edition", memory_total_mib=97887, mig_mode=None)
    ]


def test_query_csv_skips_error_lines():
    output = ["Failed to initialize NVML: Driver/library version mismatch", "NVML library version: 580.95"]
    assert parse_query_csv(output, ["index", "name"]) == []


def test_smi_q_text_and_xml_agree_on_the_h200_capture():
    text = parse_smi_q(lines("h200-x2-nvlink", "q.txt"))
    assert text == parse_smi_xml((CAPTURES / "h200-x2-nvlink" / "q.xml").read_text())
    assert (text["driver_version"], text["cuda_version"]) == ("580.159.04", "13.0")
    assert [gpu["fabric_state"] for gpu in text["gpus"]] == ["Completed", "Completed"]
    assert text["gpus"][0]["memory_total_mib"] == 143771


def test_smi_q_rtx_capture_has_no_fabric():
    result = parse_smi_q(lines("rtxpro6000se-8x-pcie", "smi_q.txt"))
    assert (result["driver_version"], result["cuda_version"]) == ("595.58.03", "13.2")
    assert len(result["gpus"]) == 8
    assert {gpu["name"] for gpu in result["gpus"]} == {"NVIDIA RTX PRO 6000 Blackwell Server Edition"}
    assert {gpu["memory_total_mib"] for gpu in result["gpus"]} == {97887}
    assert {gpu["fabric_state"] for gpu in result["gpus"]} == {None}


def test_smi_table_b200():
    result = parse_smi_table(lines("b200-8x-nvlink", "smi.txt"))
    assert (result["driver_version"], result["cuda_version"]) == ("570.158.01", "12.9")
    assert [gpu["index"] for gpu in result["gpus"]] == list(range(8))
    assert {(gpu["name"], gpu["memory_total_mib"]) for gpu in result["gpus"]} == {("NVIDIA B200", 183359)}


def test_smi_table_truncated_name_is_not_taken():
    row = "|   0  NVIDIA RTX PRO 6000 Blac...    On  |   00000000:06:00.0 Off |                    0 |"
    assert parse_smi_table([row])["gpus"][0]["name"] is None


@pytest.mark.parametrize(
    "line, expected",
    [
        (
            "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build  (dvs-builder@U22)",
            dict(version="580.159.04", open_kernel_module=True),
        ),
        (
            "NVRM version: NVIDIA UNIX x86_64 Kernel Module  570.158.01  Tue Jun 24 00:00:00 UTC 2025",
            dict(version="570.158.01", open_kernel_module=False),
        ),
    ],
)
def test_proc_driver_version(line, expected):
    assert parse_proc_driver_version([line, "GCC version:  gcc version 12.2.0"]) == expected


def test_proc_driver_version_absent():
    assert parse_proc_driver_version([]) is None


def test_query_csv_without_header_tells_fields_by_their_values():
    # A real H200 run's --format=csv,noheader line (its query: index, name, uuid, pci.bus_id, driver_version,
    # memory.total, memory.used, mig.mode.current, mig.mode.pending, compute_cap, persistence_mode).
    line = ("0, NVIDIA H200, GPU-62da0000-0000-0000-0000-000000003038, 00000000:00:06.0, 580.159.04, 143771 MiB, "
            "0 MiB, Disabled, Disabled, 9.0, Enabled")
    [gpu] = smi_captures.parse_query_csv([line])
    assert {key: gpu[key] for key in ("index", "name", "pci_bus_id", "driver_version", "memory_total_mib",
                                      "compute_capability")} == dict(
        index=0, name="NVIDIA H200", pci_bus_id="00000000:00:06.0", driver_version="580.159.04",
        memory_total_mib=143771, compute_capability="9.0")
    assert "mig_mode" not in gpu and "persistence_mode" not in gpu  # Enabled/Disabled columns cannot be told apart
    nounits = smi_captures.parse_query_csv(["0, NVIDIA H200, 143771, 0, 9.0", "1, NVIDIA H200, 143771, 0, 9.0"])
    assert [(gpu["index"], gpu["memory_total_mib"]) for gpu in nounits] == [(0, 143771), (1, 143771)]


def test_r610_table_header_names_the_driver_kmd():
    # A published 610.57.04 table (noonghunna/club-3090#1229): 'KMD Version' and 'CUDA UMD Version'.
    header = "| NVIDIA-SMI 610.57.04              KMD Version: 610.57.04     CUDA UMD Version: 13.3     |"
    assert parse_smi_table([header])["driver_version"] == "610.57.04"
    assert parse_smi_table([header])["cuda_version"] == "13.3"
