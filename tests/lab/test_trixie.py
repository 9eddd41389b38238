"""A freshly imaged Debian 13 (trixie) host from zero to serving in one deploy: NVIDIA's
repository for debian13, the driver, SGLang's virtualenv on trixie's Python 3.13. One extra bare
lab host booted from the trixie root (`python -m lab up --os trixie`; built once per machine)."""

import time

import pytest

from lab import fleet
from tests.conftest import LAB_HOSTS
from tests.helpers import extra_bare_host, run_deploy, server_info

pytestmark = pytest.mark.lab


@pytest.fixture(scope="module")
def trixie(lab_hosts):
    start = time.monotonic()
    for host in extra_bare_host(lab_hosts, "pcie", LAB_HOSTS, suite="trixie"):
        print(f"\ntrixie host up (its root built once per machine): {time.monotonic() - start:.0f} s")
        yield host


def test_a_fresh_trixie_host_serves_after_one_deploy_with_install_driver(trixie):
    assert trixie.suite == "trixie"
    assert fleet.ssh(trixie, ". /etc/os-release; echo $ID $VERSION_ID; python3 -c 'import sys; print(sys.version_info[:2])'"
                     ).split("\n")[:2] == ["debian 13", "(3, 13)"]
    start = time.monotonic()
    first = run_deploy("--limit", trixie.name, "--data", "install_driver=true")
    print(f"trixie, from zero to serving: {time.monotonic() - start:.0f} s")
    assert first.returncode == 0, first.output[-3000:]
    assert "/compute/cuda/repos/debian13/x86_64/ /" in fleet.ssh(trixie, "cat /etc/apt/sources.list.d/cuda-*.list")
    assert fleet.ssh(trixie, "runuser -u sglang -- /opt/specfleet/sglang-venv-*/bin/python -c 'import sys; print(sys.version_info[:2])'"
                     ).strip() == "(3, 13)"
    assert server_info(trixie)["speculative_algorithm"] == "DFLASH"
