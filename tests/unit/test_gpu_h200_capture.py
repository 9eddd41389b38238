"""Replay of the real 1x H200 capture (tests/fixtures/nvidia-smi/h200-x1): the facts ran
there through pyinfra @local (facts.txt) and classify ran there too (classify.json); the
controller must read the same raw outputs the same way."""

import json
import re
import runpy
import subprocess
import sys
from pathlib import Path

from operations.gpu.checks import check_gpu_class
from operations.gpu.facts import NvidiaDriver, NvidiaFabric, NvidiaTopology
from operations.gpu.parse import parse_query_csv

REPO = Path(__file__).resolve().parents[2]
CAPTURE = REPO / "tests" / "fixtures" / "nvidia-smi" / "h200-x1"


def text_lines(file_name):
    return (CAPTURE / file_name).read_text().splitlines()


def facts_on_the_host():
    """{fact class name: value} from the `pyinfra @local fact` output captured there."""
    pattern = r"--> Fact data for: operations\.gpu\.facts\.(\w+)\n(\{.*?\n\})\n"
    blocks = re.findall(pattern, (CAPTURE / "facts.txt").read_text(), re.S)
    return {name: json.loads(block)["@local"] for name, block in blocks}


def test_classify_on_the_controller_equals_the_host_and_case_json():
    result = subprocess.run([sys.executable, "-m", "operations.gpu", "classify", str(CAPTURE)],
                            cwd=REPO, capture_output=True, text=True, check=True)
    found = json.loads(result.stdout)
    assert found == json.loads((CAPTURE / "classify.json").read_text())
    case = json.loads((CAPTURE / "case.json").read_text())
    assert found == {key: case[key] for key in found}
    # A single GPU has no pair: nothing says NVLink or PCIe, and nothing is degraded.
    assert (found["gpu_count"], found["interconnect"], found["degraded"], found["host_class"]) == (1, "unknown", False, "unknown")


def test_facts_processed_here_equal_the_facts_pyinfra_gathered_there():
    there = facts_on_the_host()
    assert sorted(there) == ["NvidiaDriver", "NvidiaFabric", "NvidiaGpus", "NvidiaTopology", "RebootPending"]
    assert NvidiaTopology().process(text_lines("topo.txt")) == there["NvidiaTopology"]
    assert NvidiaDriver().process(text_lines("proc_driver_nvidia_version.txt") + text_lines("q.txt")) == there["NvidiaDriver"]
    assert NvidiaFabric().process(text_lines("q.txt"))["gpus"] == there["NvidiaFabric"]["gpus"]
    gpus = parse_query_csv(text_lines("query.csv"))
    assert [{key: gpu[key] for key in there["NvidiaGpus"][0]} for gpu in gpus] == there["NvidiaGpus"]
    assert there["RebootPending"] == []
    assert there["NvidiaFabric"]["nvswitch"] is False  # the devices folder existed but was empty


def test_the_h200_fails_the_b200_class_with_clear_sentences():
    there = facts_on_the_host()
    expected = runpy.run_path(str(REPO / "group_data" / "b200_nvlink.py"))["gpu"]
    problems = check_gpu_class(
        "h200-1", "b200_nvlink", expected,
        gpus=there["NvidiaGpus"], topology=there["NvidiaTopology"], driver=there["NvidiaDriver"],
        reboot_pending=there["RebootPending"],
    )
    assert problems == [
        "h200-1: expected 8 GPUs matching ^NVIDIA B200$ (class b200_nvlink), found 1 (0 matching; names: "
        "NVIDIA H200): check `nvidia-smi -L`; a missing GPU usually needs a reseat or an RMA, a wrong model "
        "means this host belongs to another class",
        "h200-1: expected nvlink interconnect (class b200_nvlink), found unknown (no GPU pairs): check "
        "`nvidia-smi topo -m`; this host may belong to another class",
    ]
