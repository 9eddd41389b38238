"""The HGX Hopper classes on lab hosts: an 8x H100 SXM5 (h100_sxm) and an 8x H200 (h200_sxm) host, their GPU
stand-ins built from the real captures (lab/gpu_standin/build_profiles.py), booted beside the lab's with
their driver, converge in one deploy and a re-run changes nothing."""

import pytest

import lab
from tests.conftest import LAB_HOSTS
from tests.helpers import changed_operations, run_deploy, server_info

pytestmark = pytest.mark.lab

# Qwen3.6-27B on the H100 (its class lays it out at TP 2: four replicas); the default Kimi K2.6 on the H200
# (one server over all eight GPUs). Kimi K2.6 is no H100 profile: its real weights leave no KV cache there.
PROFILES = "lab-h100-1=qwen36_ddtree"


@pytest.fixture(scope="module")
def hopper(lab_hosts):
    hosts = {h.host_class: h for h in lab.up(f"{LAB_HOSTS},h100=1,h200=1", log=lambda line: None)}
    yield hosts["h100_sxm"], hosts["h200_sxm"]
    lab.up(LAB_HOSTS, log=lambda line: None)


def test_an_h100_and_an_h200_host_converge_and_a_rerun_changes_nothing(hopper, monkeypatch):
    h100, h200 = hopper
    monkeypatch.setenv("SPECFLEET_LAB_PROFILES", PROFILES)
    limit = ("--limit", h100.name, "--limit", h200.name)
    first = run_deploy(*limit)
    assert first.returncode == 0 and "SGLang service sglang@qwen36_ddtree-gpu6-7" in changed_operations(first.output), \
        first.output[-4000:]
    kimi = server_info(h200)
    assert (kimi["tp_size"], kimi["attention_backend"], kimi["speculative_draft_attention_backend"]) == (8, "fa3", "fa3")
    for port in (30000, 30002, 30004, 30006):  # four TP 2 replicas, each on its pair of GPUs
        qwen = server_info(h100, port)
        assert (qwen["tp_size"], qwen["speculative_algorithm"], qwen["attention_backend"]) == (2, "DDTREE", "fa3")
    second = run_deploy(*limit)
    assert second.returncode == 0 and changed_operations(second.output) == [], second.output[-4000:]
