"""Fixtures shared by the suites: the lab fleet, booted once per test run."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from lab import fleet  # noqa: E402

LAB_HOSTS = os.environ.get("SPECFLEET_LAB_HOSTS", fleet.DEFAULT_SPEC)


def pytest_collection_modifyitems(items):
    # Lifecycle tests tear the lab down: everything that shares the lab goes first.
    items.sort(key=lambda item: item.get_closest_marker("lab_lifecycle") is not None)


def lab_cli(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "lab", *args], cwd=REPO, capture_output=True,
                          text=True, check=check)


@pytest.fixture(scope="session")
def lab_hosts() -> list[fleet.LabHost]:
    """The running lab (booted here unless it already runs with this spec)."""
    result = lab_cli("up", "--hosts", LAB_HOSTS, check=False)
    assert result.returncode == 0, f"python -m lab up failed:\n{result.stdout}\n{result.stderr}"
    return fleet.read_fleet()


@pytest.fixture(scope="session")
def pcie_host(lab_hosts) -> fleet.LabHost:
    return next(h for h in lab_hosts if h.host_class == "rtx_pro_6000_pcie")


@pytest.fixture(scope="session")
def b200_host(lab_hosts) -> fleet.LabHost:
    return next(h for h in lab_hosts if h.host_class == "b200_nvlink")
