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


PYINFRA = Path(sys.executable).parent / "pyinfra"


def run_deploy(*args: str, token: str = "hf_lab_granted", group_data: Path | None = None,
               timeout: float = 600) -> subprocess.CompletedProcess:
    """`pyinfra -y inventory/lab.py deploy.py ARGS` as a user runs it, with HF_TOKEN set to `token`.

    With --dry there is no -y: pyinfra then detects and lists what would change.
    """
    extra = ["--group-data", str(group_data)] if group_data else []
    confirm = [] if "--dry" in args else ["-y"]
    command = [str(PYINFRA), *confirm, *extra, "inventory/lab.py", "deploy.py", *args]
    env = {**os.environ, "HF_TOKEN": token}
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, env=env, timeout=timeout)
    result.output = result.stdout + result.stderr
    return result


def write_group_data(directory: Path, group: str, code: str) -> Path:
    """An extra group_data folder (pyinfra --group-data) whose `group`.py overrides keys with `code`."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"{group}.py").write_text(
        f"import copy, runpy\nbase = runpy.run_path({str(REPO / 'group_data' / (group + '.py'))!r})\n{code}\n")
    return directory


@pytest.fixture(scope="session")
def deployed_lab(lab_hosts) -> subprocess.CompletedProcess:
    """The lab after one converging deploy (shared by every test that only reads it)."""
    result = run_deploy()
    assert result.returncode == 0, result.output[-4000:]
    return result


def pytest_addoption(parser):
    # tests/deployed: verify deployed hosts (see tests/deployed/conftest.py).
    group = parser.getgroup("specfleet", "verify deployed hosts (tests/deployed)")
    group.addoption("--inventory", default=None, metavar="PATH",
                    help="pyinfra inventory whose hosts tests/deployed verifies (default: the lab, "
                         "deployed first by the session)")
    group.addoption("--limit", action="append", default=[], metavar="NAME",
                    help="only the hosts matching NAME (a host glob or a group), as pyinfra --limit; repeatable")
