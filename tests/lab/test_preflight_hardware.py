"""A host that is not what its class says stops in preflight, naming what differs, before any change."""

import pytest

from lab import fleet
from tests.helpers import UNIT_FILE, run_deploy
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
