"""Replay of the real H200 captures (tests/fixtures/nvidia-smi/h200-x1 and h200-x2): on each
host the facts ran through pyinfra @local (facts.txt) and classify ran too (classify.json);
the controller must read the same raw outputs the same way."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tools.gpu.capture import facts_printed
from operations.gpu.checks import check_gpu_class
from operations.gpu.facts import NvidiaDriver, NvidiaFabric, NvidiaTopology
from tools.gpu.smi_captures import parse_query_csv
from tests.unit.group_data import class_expectations

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures" / "nvidia-smi"

NAME_SENTENCE = (
    "{host}: expected 8 GPUs matching ^NVIDIA B200$ (class b200_nvlink), found {count} (0 matching; names: "
    "NVIDIA H200): check `nvidia-smi -L`; a missing GPU usually needs a reseat or an RMA, a wrong model "
    "means this host belongs to another class"
)

# What each capture must say; the rest is compared between the host and the controller.
CAPTURES = {
    # A single GPU has no pair: nothing says NVLink or PCIe, and nothing is degraded.
    "h200-x1": dict(
        gpu_count=1,
        interconnect="unknown",
        links={},
        fabric=[(None, None)],
        b200_problems=[
            NAME_SENTENCE.format(host="h200-x1", count=1),
            "h200-x1: expected nvlink interconnect (class b200_nvlink), found unknown (no GPU pairs): check "
            "`nvidia-smi topo -m`; this host may belong to another class",
        ],
    ),
    # Two GPUs joined by 18 NVLinks: the interconnect fits b200_nvlink, only the GPUs do not.
    "h200-x2": dict(
        gpu_count=2,
        interconnect="nvlink",
        links={"0-1": "NV18"},
        fabric=[("Completed", "Success")] * 2,
        b200_problems=[NAME_SENTENCE.format(host="h200-x2", count=2)],
    ),
}


@pytest.fixture(params=sorted(CAPTURES))
def capture(request):
    return request.param, FIXTURES / request.param, CAPTURES[request.param]


def text_lines(folder, file_name):
    return (folder / file_name).read_text().splitlines()


def facts_on_the_host(folder):
    """{fact class name: value} from the `pyinfra @local fact` output captured there."""
    return facts_printed((folder / "facts.txt").read_text())


def test_classify_on_the_controller_equals_the_host_and_case_json(capture):
    case, folder, want = capture
    result = subprocess.run([sys.executable, "-m", "tools.gpu", "classify", str(folder)],
                            cwd=REPO, capture_output=True, text=True, check=True)
    found = json.loads(result.stdout)
    there = json.loads((folder / "classify.json").read_text())
    # Every field the host's classify printed; fields classify gained since are checked below.
    assert {key: found[key] for key in there} == there
    assert (found["gpu_models"], found["mig_mode"]) == ([dict(name="NVIDIA H200", count=want["gpu_count"])],
                                                        "Disabled")
    case_json = json.loads((folder / "case.json").read_text())
    assert case_json["case"] == case
    assert {key: found[key] for key in there} == {key: case_json[key] for key in there}
    assert (found["gpu_name"], found["gpu_count"], found["memory_total_mib"]) == ("NVIDIA H200", want["gpu_count"], 143771)
    assert (found["interconnect"], found["degraded"], found["host_class"]) == (want["interconnect"], False, "unknown")


def test_facts_processed_here_equal_the_facts_pyinfra_gathered_there(capture):
    _, folder, want = capture
    there = facts_on_the_host(folder)
    assert sorted(there) == ["NvidiaDriver", "NvidiaFabric", "NvidiaGpus", "NvidiaTopology", "RebootPending"]
    assert NvidiaTopology().process(text_lines(folder, "topo.txt")) == there["NvidiaTopology"]
    assert there["NvidiaTopology"]["links"] == want["links"]
    driver = NvidiaDriver().process(text_lines(folder, "proc_driver_nvidia_version.txt") + text_lines(folder, "q.txt"))
    # The GPUs' minor numbers are read from the same -q, after this capture was gathered: its fact lacks them.
    assert driver.pop("gpu_minor_numbers") == list(range(want["gpu_count"])) and driver == there["NvidiaDriver"]
    assert NvidiaFabric().process(text_lines(folder, "q.txt"))["gpus"] == there["NvidiaFabric"]["gpus"]
    assert [(gpu["fabric_state"], gpu["fabric_status"]) for gpu in there["NvidiaFabric"]["gpus"]] == want["fabric"]
    gpus = parse_query_csv(text_lines(folder, "query.csv"))
    assert [{key: gpu[key] for key in there["NvidiaGpus"][0]} for gpu in gpus] == there["NvidiaGpus"]
    assert len(there["NvidiaGpus"]) == want["gpu_count"]
    assert {gpu["persistence_mode"] for gpu in there["NvidiaGpus"]} == {"Enabled"}
    assert there["RebootPending"] == []
    assert there["NvidiaFabric"]["nvswitch"] is False  # the devices folder existed but was empty


def test_nv_count_in_topo_equals_the_links_nvlink_s_lists(capture):
    _, folder, want = capture
    if not (folder / "nvlink-s.txt").exists():
        pytest.skip("no `nvidia-smi nvlink -s` in this capture")
    links_per_gpu = [len(re.findall(r"^\s+Link \d+: ", block, re.M))
                     for block in re.split(r"^GPU \d+: ", (folder / "nvlink-s.txt").read_text(), flags=re.M)[1:]]
    bonded = {int(link[2:]) for link in want["links"].values()}
    assert len(links_per_gpu) == want["gpu_count"] and set(links_per_gpu) == bonded


def test_the_h200_fails_the_b200_class_with_clear_sentences(capture):
    case, folder, want = capture
    there = facts_on_the_host(folder)
    expected = class_expectations("b200_nvlink")
    problems = check_gpu_class(
        case, "b200_nvlink", expected,
        gpus=there["NvidiaGpus"], topology=there["NvidiaTopology"], driver=there["NvidiaDriver"],
        reboot_pending=there["RebootPending"],
    )
    assert problems == want["b200_problems"]
