"""Fixtures shared by the suites: the lab fleet, booted once per test run (helpers: tests/helpers.py)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

# Under pytest-xdist (make test), each worker drives a lab of its own: the next lab ids after
# SPECFLEET_LAB_ID (each its own bridge, subnet, ports and hosts), set before lab.config reads it. The
# deploys, lab commands and pytest runs the tests start inherit the worker's id as it is: the worker's
# name leaves the environment, so a pytest they start adds nothing to it.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ["SPECFLEET_LAB_ID"] = str(int(os.environ.get("SPECFLEET_LAB_ID", "0"))
                                         + int(os.environ.pop("PYTEST_XDIST_WORKER").removeprefix("gw")))

import lab  # noqa: E402
from lab import fleet  # noqa: E402
from lab.hub import clear_faults  # noqa: E402
from tests.helpers import LAB_HOSTS, run_deploy  # noqa: E402


# Seconds the longest modules took in make test (the 2-core machine, other labs running beside it), without
# the lab's boot and first deploy that a worker's first lab module pays (about 180 s). test_real_path.py is
# docs/lab.md's figure; the rollout, revisions, multinode, operator-tools and extra-host modules are not
# measured so yet: they stand where what their fixtures boot and deploy (the gateway host, an extra
# host) puts them.
LONGEST_FIRST = {
    "tests/lab/test_replicas.py": 800,
    "tests/lab/test_gateway.py": 870,
    "tests/lab/test_profile_switch.py": 400,
    "tests/lab/test_serving_benchmark.py": 650,
    "tests/lab/test_rollout.py": 600,
    "tests/lab/test_first_deploy.py": 500,
    "tests/lab/test_bench_replicas.py": 150,
    "tests/lab/test_real_path.py": 380,
    "tests/lab/test_revisions.py": 250,
    "tests/faults/test_service_faults.py": 320,
    "tests/lab/test_rollout_long_requests.py": 300,
    "tests/lab/test_deploy.py": 450,
    "tests/lab/test_multinode.py": 250,
    "tests/lab/test_weights_fanout.py": 170,
    "tests/lab/test_tune.py": 340,
    "tests/lab/test_operator_tools.py": 250,
    "tests/lab/test_fresh_host.py": 220,
    "tests/lab_code/test_sglang_standin.py": 210,
    "tests/lab/test_engine_rules.py": 200,
    "tests/lab/test_access_pending.py": 200,
    "tests/lab/test_trixie.py": 200,
    "tests/lab/test_hopper_classes.py": 150,
    "tests/faults/test_downloads.py": 175,
    "tests/lab_code/test_gpu_standin.py": 120,
    "tests/unit/test_engine_startup.py": 130,
    "tests/unit/test_host_scripts.py": 120,
    "tests/lab_code/test_sglang_kv_pool.py": 110,
    "tests/deployed/test_catches_faults.py": 110,
    "tests/lab/test_git_build.py": 120,
}


def pytest_collection_modifyitems(items):
    # Lifecycle tests tear the lab down: everything that shares the lab goes first. Then the longest
    # modules (LONGEST_FIRST), so that make test's workers, which take files in this order
    # (--no-loadscope-reorder), start them at once and fill the rest of the run with the short ones.
    items.sort(key=lambda item: (item.get_closest_marker("lab_lifecycle") is not None,
                                 -LONGEST_FIRST.get(item.nodeid.split("::")[0], 0)))


def pytest_xdist_make_scheduler(config, log):
    """--dist loadfile (make test) with a worker taking its next module when it reaches the last test of
    its current one: xdist's own takes it with two tests left, and the module it took then waits behind
    both (in make test, test_rollout.py went to the worker of test_replicas.py with two tests left there, at
    764 s, and started at 1951 s)."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class ModuleAtATime(LoadFileScheduling):
        def _reschedule(self, node):
            # One test left: the worker waits for the next one before it runs it (the next test is known
            # to every test's teardown), so the next module goes out now.
            if not node.shutting_down and self.workqueue and self._pending_of(self.assigned_work[node]) > 1:
                return
            super()._reschedule(node)

    return ModuleAtATime(config, log)


@pytest.fixture(scope="session")
def lab_hosts() -> list[fleet.LabHost]:
    """The running lab (booted here unless it already runs with this spec)."""
    lines = []
    try:
        return lab.up(LAB_HOSTS, log=lines.append)
    except (SystemExit, subprocess.CalledProcessError) as error:
        pytest.fail(f"lab up --hosts {LAB_HOSTS} failed: {error}\n" + "\n".join(lines))


@pytest.fixture(scope="session")
def pcie_host(lab_hosts) -> fleet.LabHost:
    return next(h for h in lab_hosts if h.host_class == "rtx_pro_6000_pcie")


@pytest.fixture(scope="session")
def b200_host(lab_hosts) -> fleet.LabHost:
    return next(h for h in lab_hosts if h.host_class == "b200_nvlink")


@pytest.fixture(scope="session")
def local_hub(tmp_path_factory):
    """The lab hub on 127.0.0.1 over a store of its own (tests/lab_hub.py): no lab host needed."""
    from tests import lab_hub  # sets huggingface_hub's environment: only where a test asks for the hub
    server = lab_hub.start(tmp_path_factory.mktemp("store"), tmp_path_factory.mktemp("state"))
    yield server
    server.stop()


@pytest.fixture
def hub(local_hub):
    """The local hub with no fault set, before and after the test."""
    clear_faults(local_hub.state)
    yield local_hub
    clear_faults(local_hub.state)


@pytest.fixture
def site_dir(tmp_path, monkeypatch):
    """An empty site directory (SPECFLEET_SITE) of the test's own."""
    directory = tmp_path / "site"
    directory.mkdir()
    monkeypatch.setenv("SPECFLEET_SITE", str(directory))
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
                    help="pyinfra inventory whose hosts tests/deployed verifies, as deployed (testinfra's own "
                         "--hosts names hosts instead)")
    group.addoption("--lab", action="store_true", default=False,
                    help="tests/deployed boots the lab (SPECFLEET_LAB_ID), deploys it, verifies it and breaks it "
                         "on purpose (make test)")
    group.addoption("--limit", action="append", default=[], metavar="NAME",
                    help="only the hosts matching NAME (a host glob or a group), as pyinfra --limit; repeatable")
