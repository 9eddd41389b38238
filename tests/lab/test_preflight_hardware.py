"""A host that is not what its class says stops in preflight, naming what differs, before any change."""

import re

import pytest

from lab import fleet
from tests.helpers import UNIT_FILE, run_deploy, write_group_data
from tests.helpers import main_pid, operations_started

pytestmark = pytest.mark.lab


@pytest.mark.parametrize("profile, expected", [
    ("b200_nvlink_degraded", "expected NVLink between every GPU pair"),
    ("b200_nvlink_7gpu", "expected 8 GPUs matching ^NVIDIA B200$ (class b200_nvlink), found 7"),
])
def test_wrong_hardware_fails_preflight_and_changes_nothing(deployed_lab, b200_host, profile, expected):
    unit_before = fleet.ssh(b200_host, f"sha1sum {UNIT_FILE}")
    pid_before = main_pid(b200_host)
    fleet.set_gpu_profile(b200_host, profile)
    try:
        result = run_deploy("--limit", b200_host.name)
    finally:
        fleet.set_gpu_profile(b200_host, "b200_nvlink")
    assert result.returncode != 0
    assert f"[{b200_host.name}] {b200_host.name}: {expected}" in result.output, result.output[-3000:]
    assert operations_started(result.output) == ["Preflight"]
    assert fleet.ssh(b200_host, f"sha1sum {UNIT_FILE}") == unit_before
    assert main_pid(b200_host) == pid_before


NVML_VERSION = "/usr/lib/specfleet-lab/nvml-version"  # the stand-in's installed NVML library (lab/gpu_standin/nvidia-smi)


def test_an_nvidia_smi_that_cannot_initialise_nvml_says_why_and_what_to_do(deployed_lab, b200_host):
    """Driver packages upgraded without a reboot: nvidia-smi exits 18 with NVML's words on stdout. The GPUs
    are unknown (not zero, not nulls), and preflight says so in one line, with the fix."""
    pid_before = main_pid(b200_host)
    had = fleet.ssh(b200_host, f"cat {NVML_VERSION} 2>/dev/null", check=False)
    fleet.ssh(b200_host, f"echo '595.58.03 13.2' > {NVML_VERSION}")
    try:
        result = run_deploy("--limit", b200_host.name)
    finally:
        fleet.ssh(b200_host, f"printf %s '{had}' > {NVML_VERSION}" if had else f"rm -f {NVML_VERSION}")
    assert result.returncode != 0
    assert (f"[{b200_host.name}] {b200_host.name}: expected 8 GPUs (class b200_nvlink), found nvidia-smi unable to "
            "read them (exit code 18: Failed to initialize NVML: Driver/library version mismatch; NVML library "
            "version: 595.58): the NVML library is another version than the loaded kernel module (a driver installed "
            "or upgraded without a reboot): reboot the host so the installed driver's module loads") in result.output, \
        result.output[-3000:]
    assert "found 0 (" not in result.output  # not zero GPUs
    assert operations_started(result.output) == ["Preflight"]
    assert main_pid(b200_host) == pid_before


def test_gpus_that_hold_the_weights_but_not_the_kv_cache_are_refused_in_one_line_before_anything_changes(
        deployed_lab, pcie_host, tmp_path):
    """rtx_pro_6000_pcie_small_memory: 1,024 MiB a card, the class's min_memory_mib lowered to it so that the
    hardware itself passes. The lab's tiny Kimi K2.6 fits (~4 MiB a GPU at TP 8), its KV cache of one full
    context of the class's layout (context_length 196,608, the min_kv_tokens default) does not: preflight's KV
    plan refuses it, alone, before any operation runs."""
    small_cards = write_group_data(tmp_path, "rtx_pro_6000_pcie",
                                   "expected_gpus = dict(base['expected_gpus'], min_memory_mib=1024)")
    unit_before, pid_before = fleet.ssh(pcie_host, f"sha1sum {UNIT_FILE}"), main_pid(pcie_host)
    fleet.set_gpu_profile(pcie_host, "rtx_pro_6000_pcie_small_memory")
    try:
        result = run_deploy("--limit", pcie_host.name, group_data=small_cards)
    finally:
        fleet.set_gpu_profile(pcie_host, "rtx_pro_6000_pcie")
    assert result.returncode != 0
    refusals = [line.strip() for line in result.output.splitlines()
                if line.strip().startswith(f"[{pcie_host.name}] {pcie_host.name}: ")]
    assert len(refusals) == 1, result.output[-3000:]
    assert re.fullmatch(rf"\[{pcie_host.name}\] {pcie_host.name}: sglang@kimi_k26_dflash-gpu0-7: its KV cache holds "
                        r"\d+ tokens \(0\.\d GiB a GPU at \d+ bytes a token\), fewer than one full context \(196608 tokens, "
                        r"the min_kv_tokens default\): run fewer replicas, a larger tp_size, .*", refusals[0]), refusals[0]
    assert operations_started(result.output) == ["Preflight"]
    assert fleet.ssh(pcie_host, f"sha1sum {UNIT_FILE}") == unit_before and main_pid(pcie_host) == pid_before
