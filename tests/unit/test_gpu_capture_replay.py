"""Replay of every folder `python -m tools.gpu capture` made (a fixture folder with judged.json):
the controller must judge its files as the host did, and an H200 host (2x today, 8x HGX when
#17 runs) must read as NVLink, registered with the fabric, passing the smoke test on all GPUs
with NVLink multicast off, and fail the b200_nvlink class on the GPU model alone."""

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tools.gpu.capture import NO_MULTICAST, RAW_CAPTURES, facts_printed, judge, zero_identifiers

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures" / "nvidia-smi"
CAPTURES = sorted(path.parent.name for path in FIXTURES.glob("*/judged.json"))


@pytest.fixture(params=CAPTURES)
def capture(request):
    folder = FIXTURES / request.param
    return folder, json.loads((folder / "judged.json").read_text()), json.loads((folder / "case.json").read_text())


def test_the_two_h200_captures_are_among_the_replayed():
    assert "h200-x2-capture" in CAPTURES


def as_judged_there(judged_here: dict, judged_there: dict) -> dict:
    """What the controller judges, in the fields the capture's judgement holds: classify fields added
    since (gpu_models, mig_mode) are left to tests/unit/test_gpu_classify_cli.py."""
    return dict(judged_here, classify={key: judged_here["classify"][key] for key in judged_there["classify"]})


def test_judged_here_equals_what_the_capture_judged(capture):
    folder, judged, case = capture
    assert as_judged_there(judge(folder, judged["class_name"]), judged) == judged
    assert sorted(case["files"]) == sorted(path.name for path in folder.iterdir())
    assert set(RAW_CAPTURES) | {"facts.txt", "record.json", "pyinfra-smoke.txt", "judged.json"} <= set(case["files"])


def test_the_judge_only_command_writes_the_same_judgement(capture, tmp_path):
    folder, judged, _ = capture
    copy = tmp_path / folder.name
    shutil.copytree(folder, copy)  # links followed: the copy holds the files
    (copy / "judged.json").unlink()
    subprocess.run([sys.executable, "-m", "tools.gpu", "capture", "--judge-only", str(copy)],
                   cwd=REPO, check=True, capture_output=True)
    assert as_judged_there(json.loads((copy / "judged.json").read_text()), judged) == judged


def test_an_h200_host_fails_the_b200_class_on_the_gpu_model_only(capture):
    _, judged, case = capture
    name, count = case["gpu_name"], case["gpu_count"]
    assert name != "NVIDIA B200" and judged["class_name"] == "b200_nvlink"
    assert judged["class_problems"] == [
        f"@local: expected 8 GPUs matching ^NVIDIA B200$ (class b200_nvlink), found {count} (0 matching; names: "
        f"{name}): check `nvidia-smi -L`; a missing GPU usually needs a reseat or an RMA, a wrong model means "
        "this host belongs to another class"
    ]


def test_classify_reads_nvlink_and_the_case_agrees(capture):
    _, judged, case = capture
    found = judged["classify"]
    assert (found["interconnect"], found["degraded"], found["host_class"]) == ("nvlink", False, "unknown")
    assert (found["gpu_name"], found["gpu_count"], found["driver_version"]) == (
        case["gpu_name"], case["gpu_count"], case["driver_version"])


def test_every_registered_gpu_reads_fabric_completed(capture):
    folder, judged, case = capture
    registration = judged["fabric_registration"]
    assert len(registration) == case["gpu_count"]
    assert {state for state in registration.values() if not state.startswith("None")} == {"Completed/Success"}
    # NVSwitch presence and the fabric manager unit decide what check_fabric says about them.
    nvswitch_problem = [problem for problem in judged["fabric_problems"] if "NVSwitch devices" in problem]
    assert bool(nvswitch_problem) is not judged["nvswitch"]
    assert not [problem for problem in judged["fabric_problems"] if "fabric State Completed" in problem]


def test_the_smoke_test_ran_on_all_gpus_with_multicast_off_and_passed(capture):
    folder, judged, case = capture
    smoke = judged["smoke"]
    assert (smoke["verdict"], smoke["gpus"]) == ("passed", case["gpu_count"])
    assert list(smoke["busbw_gbps_by_mib"]) == ["1", "16", "128", "512"]
    assert smoke["busbw_gbps_by_mib"]["512"] >= smoke["floor_gbps"]
    assert case["environment"] == NO_MULTICAST
    assert f"[@local] {smoke['summary']}" in (folder / "pyinfra-smoke.txt").read_text()


def test_the_facts_cover_what_the_deploy_reads_and_nothing_identifies_the_host(capture):
    folder, _, case = capture
    facts = facts_printed((folder / "facts.txt").read_text())
    assert {"NvidiaGpus", "NvidiaTopology", "NvidiaDriver", "NvidiaFabric", "RebootPending"} <= set(facts)
    if "NvidiaHost" in facts:  # the one-command fact preflight reads: the same four parts
        assert facts["NvidiaHost"] == {name: facts[name] for name in facts["NvidiaHost"]}
    for file_name in RAW_CAPTURES:
        text = (folder / file_name).read_text()
        assert zero_identifiers(text, {}) == text, file_name
    uuids = re.findall(r"GPU-[0-9a-f-]{36}", (folder / "q.txt").read_text())
    assert len(set(uuids)) == case["gpu_count"]


def test_zero_identifiers_zeroes_serials_pdis_and_numbers_uuids_across_files():
    uuids = {}
    q = ("    Serial Number                                      : 1654923012345\n"
         "    GPU UUID                                           : GPU-3f2a9c1e-77b0-4c1d-9e2f-0a1b2c3d4e5f\n"
         "    GPU PDI                                            : 0x8c1f2e3d4a5b6c7d\n"
         "        Chassis Serial Number                          : N/A\n"
         "        ClusterUUID                                    : 5d1e2f3a-4b5c-6d7e-8f90-a1b2c3d4e5f6\n")
    assert zero_identifiers(q, uuids) == (
        "    Serial Number                                      : 0000000000000\n"
        "    GPU UUID                                           : GPU-00000000-0000-0000-0000-000000000000\n"
        "    GPU PDI                                            : 0x0000000000000000\n"
        "        Chassis Serial Number                          : N/A\n"
        "        ClusterUUID                                    : 00000001-0000-0000-0000-000000000001\n")
    xml = "<serial>1654923012345</serial><uuid>GPU-3f2a9c1e-77b0-4c1d-9e2f-0a1b2c3d4e5f</uuid><pdi>0x8c1f</pdi>"
    assert zero_identifiers(xml, uuids) == (
        "<serial>0000000000000</serial><uuid>GPU-00000000-0000-0000-0000-000000000000</uuid><pdi>0x0000</pdi>")
