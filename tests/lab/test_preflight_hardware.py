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
