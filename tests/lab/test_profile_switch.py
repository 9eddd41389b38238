"""Changing what a host behind a gateway serves (another profile, a site profile): the units it replaces stay
restorable until the new ones generate, and the gateway's workers, Prometheus's targets, status.py and
tests/deployed follow what the hosts serve.

The lab's fleet gets `gateway=1` for this module, as tests/lab/test_gateway.py's does (a module of its own so
that its switches and the gateway's own checks run on two workers of make test).
"""

import json
import re
import shutil
import subprocess
import sys

import pytest

from lab import fleet
from tests.helpers import (LAB_INVENTORY, PYINFRA, REPO, SGLANG_UNIT, behind_gateway, changed_operations, run_deploy,
                           write_group_data)
from tests.lab.test_gateway import (ADMIN_KEY, EXPOSED, GATEWAY_PORT, KEY, call, gateway_host, gateway_workers,
                                    prometheus_health, worker_hosts)

pytestmark = pytest.mark.lab


@pytest.fixture(scope="module")
def gateway_lab(lab_hosts):
    """The lab with a gateway host; the first deploy's output and how long it took."""
    with behind_gateway(*EXPOSED, key=KEY, admin_key=ADMIN_KEY) as (hosts, first, seconds):
        yield hosts, first, seconds


def switched_profile(directory, name: str, env: dict | None = None):
    """Group data giving the b200 class the profile `name`: Kimi K2.6 as shipped (one unit over the eight
    GPUs, the same model in the same gateway) under another name, with `env` for its unit."""
    shipped = str(REPO / "group_data" / "all.py")
    return write_group_data(directory, "b200_nvlink", (
        f"profiles = copy.deepcopy(runpy.run_path({shipped!r})['profiles'])\n"
        f"profiles[{name!r}] = copy.deepcopy(profiles['kimi_k26_dflash'])\n"
        + (f"profiles[{name!r}]['env'] = {env!r}\n" if env else "")
        + f"layouts = copy.deepcopy(base['layouts'])\nlayouts[{name!r}] = layouts['kimi_k26_dflash']\n"
        f"profile = {name!r}"))


def units_on(host) -> set[str]:
    return set(fleet.ssh(host, "cd /etc/systemd/system && ls -d sglang@*.service 2>/dev/null", check=False).split())


def test_a_profile_switch_whose_units_crash_loop_restores_the_units_it_replaced_in_their_gateways(gateway_lab,
                                                                                                  tmp_path):
    """The new profile's unit dies a second after each start (the stand-in's knobs file): the run fails
    naming it, and the unit it replaced serves again, registered with the gateway it left."""
    hosts, _, _ = gateway_lab
    gateway, b200 = gateway_host(hosts), next(h for h in hosts if h.host_class == "b200_nvlink")
    crash_knobs = "/etc/specfleet-lab/crash-loop.json"
    crashing = switched_profile(tmp_path, "kimi_crash", env={"SPECFLEET_SGLANG_KNOBS": crash_knobs})
    fleet.ssh(b200, f"echo '{{\"exit_after_s\": 1, \"health_fail\": true}}' > {crash_knobs}")
    try:
        result = run_deploy(*EXPOSED, group_data=crashing)
        listed = gateway_workers(gateway)
    finally:
        fleet.ssh(b200, f"rm -f {crash_knobs}")
    out = result.output
    assert result.returncode != 0, out[-3000:]
    assert "sglang@kimi_crash-gpu0-7 crash-loops: the server died 3 times since the restart" in out, out[-3000:]
    assert ("stopped sglang@kimi_crash-gpu0-7 and restored the units it replaces (sglang@kimi_k26_dflash-gpu0-7), "
            "which generate again; back in lab-gateway-1") in out, out[-3000:]
    # The replaced unit serves again, enabled, in the gateway; the new one is gone with its files.
    assert units_on(b200) == {f"{SGLANG_UNIT}.service"}
    assert fleet.ssh(b200, f"systemctl is-active {SGLANG_UNIT}; systemctl is-enabled {SGLANG_UNIT}").split() == [
        "active", "enabled"]
    assert fleet.ssh(b200, "ls /etc/specfleet/ | grep -c kimi_crash", check=False).strip() == "0"
    assert listed == {f"http://{w.address}:30000": "ready" for w in worker_hosts(hosts)}
    # The next run finds the host serving what its data says: no unit changes, nothing leaves the gateway.
    again = run_deploy(*EXPOSED)
    assert again.returncode == 0, again.output[-3000:]
    assert [op for op in changed_operations(again.output) if "sglang@" in op or "nits" in op or "teway" in op] == []


def test_a_profile_switch_drains_each_replaced_unit_once_and_removes_it_once_the_new_one_generates(gateway_lab,
                                                                                                  tmp_path):
    hosts, _, _ = gateway_lab
    gateway, b200 = gateway_host(hosts), next(h for h in hosts if h.host_class == "b200_nvlink")
    try:
        switched = run_deploy(*EXPOSED, group_data=switched_profile(tmp_path, "kimi_switched"))
        units, listed = units_on(b200), gateway_workers(gateway)
    finally:
        back = run_deploy(*EXPOSED)  # the module's later tests take group_data's profile
    assert switched.returncode == 0, switched.output[-3000:]
    assert len(re.findall(r"\[lab-b200-1\] +drained from lab-gateway-1", switched.output)) == 1, switched.output[-3000:]
    assert "removing sglang@kimi_k26_dflash-gpu0-7 (its replacement generates)" in switched.output
    assert units == {"sglang@kimi_switched-gpu0-7.service"}
    assert listed == {f"http://{w.address}:30000": "ready" for w in worker_hosts(hosts)}
    assert back.returncode == 0, back.output[-3000:]
    assert len(re.findall(r"\[lab-b200-1\] +drained from lab-gateway-1", back.output)) == 1, back.output[-3000:]
    assert units_on(b200) == {f"{SGLANG_UNIT}.service"}


def write_site_group(site, group: str, code: str) -> None:
    (site / "group_data").mkdir(parents=True, exist_ok=True)
    (site / "group_data" / f"{group}.py").write_text(code)


def test_after_site_profile_changes_status_the_deployed_checks_the_gateway_and_prometheus_agree_with_the_units(
        gateway_lab, site_dir):
    """lab-b200-1 serves Kimi under another model name (a site profile), first behind the gateway (the site
    moves the gateway to that model), then beside it (the gateway back on Kimi): each time the gateway lists
    the workers of its own model alone, Prometheus scrapes those, and status.py and tests/deployed find
    every host serving what its data says."""
    hosts, _, _ = gateway_lab
    gateway, workers = gateway_host(hosts), worker_hosts(hosts)
    b200 = next(h for h in workers if h.host_class == "b200_nvlink")
    write_site_group(site_dir, "all", "import copy\nprofiles['kimi_b'] = copy.deepcopy(profiles['kimi_k26_dflash'])\n"
                                      "profiles['kimi_b']['served_model_name'] = 'kimi-b'\n")
    write_site_group(site_dir, "b200_nvlink", "layouts['kimi_b'] = layouts['kimi_k26_dflash']\nprofile = 'kimi_b'\n")

    def agree(model: str, serving: list) -> None:
        _, listing = call(f"http://{gateway.address}:{GATEWAY_PORT}/workers", key=ADMIN_KEY)
        assert sorted((w["url"], w["model_id"], w["status"]) for w in listing["workers"]) == sorted(
            (f"http://{w.address}:30000", model, "ready") for w in serving)
        assert set(prometheus_health(gateway)) == {"smg/127.0.0.1:29000",
                                                   *(f"sglang/{w.address}:30000" for w in serving)}
        status = subprocess.run([str(PYINFRA), LAB_INVENTORY, "status.py", "--data", "json=true"], cwd=REPO,
                                capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
        replicas = [r for r in json.loads(status.stdout) if r["unit"] and r["unit"].startswith("sglang@")]
        assert {(r["host"], r["unit"]) for r in replicas} == {
            (h.name, "sglang@kimi_b-gpu0-7" if h is b200 else SGLANG_UNIT) for h in workers}, replicas
        assert all(r["state"].startswith("active") and r["deployment"] != "(none wants it)" for r in replicas)
        checks = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/deployed",
                                 "--ignore", "tests/deployed/test_catches_faults.py", "--inventory", LAB_INVENTORY],
                                cwd=REPO, capture_output=True, text=True, timeout=600)
        assert checks.returncode == 0, checks.stdout[-3000:]

    try:
        write_site_group(site_dir, "gateway", "profile = 'kimi_b'\n")
        behind = run_deploy(*EXPOSED)
        assert behind.returncode == 0, behind.output[-3000:]
        agree("kimi-b", [b200])
        (site_dir / "group_data" / "gateway.py").unlink()
        beside = run_deploy(*EXPOSED)
        assert beside.returncode == 0, beside.output[-3000:]
        agree("kimi-k2.6", [w for w in workers if w is not b200])
    finally:
        shutil.rmtree(site_dir / "group_data")
        assert run_deploy(*EXPOSED).returncode == 0  # the module's later tests take group_data's profile
    assert gateway_workers(gateway) == {f"http://{w.address}:30000": "ready" for w in workers}
