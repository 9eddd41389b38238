"""From zero to serving while access is pending: a freshly imaged host (no driver) deployed with a
token not yet granted the gated drafter is prepared as far as it can be and fails naming the
drafter's terms page; the run after access is granted fetches only the drafter and serves; a
denied token on the serving host then touches nothing. One extra bare lab host, for this module."""

import json
import time

import pytest

from lab import fleet
from lab.config import HUB_URL, TOKEN_DENIED, TOKEN_GRANTED
from lab.hub import read_request_log
from lab.services import HUB_STATE, HUB_STORE
from deployment.hosts import resolve
from operations.weights.host_scripts.weights_manifest import MANIFEST
from tests.conftest import LAB_HOSTS
from tests.helpers import extra_bare_host, main_pid, operations_started, results_table, run_deploy, server_info
from tests.unit.group_data import host_data

pytestmark = pytest.mark.lab
INSTALL = ("--data", "install_driver=true")
PCIE = "rtx_pro_6000_pcie"
LAB = resolve(host_data(PCIE, lab=True), PCIE)  # the lab's paths, repos and unit names
WEIGHTS, SERVER = LAB.weights, LAB.replicas[0]


@pytest.fixture(scope="module")
def fresh(lab_hosts):
    yield from extra_bare_host(lab_hosts, "pcie", LAB_HOSTS)


def deploy(host, token):
    start = time.monotonic()
    result = run_deploy("--limit", host.name, *INSTALL, token=token)
    result.wall_s = time.monotonic() - start
    return result


def files_fetched_by(host, since: int) -> dict[str, set[str]]:
    """Per repo, the files the host itself asked the hub or its CDN for since log entry `since`."""
    fetched = {repo.repo_id: set() for repo in WEIGHTS.repos}
    for entry in read_request_log(HUB_STATE)[since:]:
        for repo_id, paths in fetched.items():
            # The hub's /REPO/resolve/COMMIT/FILE, the CDN's /REPO/COMMIT/FILE.
            if entry["client"] == host.address and entry["path"].startswith(f"/{repo_id}/"):
                paths.add(entry["path"].removeprefix(f"/{repo_id}/").removeprefix("resolve/").split("/", 1)[1])
    return fetched


def manifest_written(host, repo, timeout_s: float = 60) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if fleet.ssh(host, f"test -f {repo.local_dir}/{MANIFEST} && echo yes", check=False).strip() == "yes":
            return True
        time.sleep(1)
    return False


def test_prepared_while_the_drafter_waits_for_access_then_only_the_drafter_is_fetched(fresh):
    terms = f"accept its terms at {HUB_URL}/{WEIGHTS.drafter.repo_id}"
    mark = len(read_request_log(HUB_STATE))
    pending = deploy(fresh, TOKEN_DENIED)
    print(f"\naccess pending, from zero to prepared: {pending.wall_s:.0f} s")
    assert pending.returncode != 0
    assert (f"[{fresh.name}] {fresh.name}: the token has no access to the gated repo {WEIGHTS.drafter.repo_id}: "
            f"{terms}") in pending.output, pending.output[-3000:]
    assert f"everything else is prepared and the downloads it may read go on in their units " \
           f"({WEIGHTS.target.unit_name}.service)" in pending.output
    started = operations_started(pending.output)
    assert {"NVIDIA open driver", "Boot into the installed driver", f"SGLang ({SERVER.engine.venv_name})",
            "GPU smoke test", "Weights"} <= set(started) and started[-1] == "Access to gated repos", started
    # Prepared: driver loaded, SGLang's venv, the target downloading in its unit; nothing serves yet.
    assert fleet.ssh(fresh, "nvidia-smi -L | wc -l").strip() == "8"
    fleet.ssh(fresh, f"{SERVER.engine.venv}/bin/python -c 'import sglang'")
    assert fleet.ssh(fresh, f"test -e {SERVER.unit_file} || systemctl cat {WEIGHTS.drafter.unit_name} || echo none",
                     check=False).strip() == "none"
    assert manifest_written(fresh, WEIGHTS.target), "the target's download did not complete in its unit"

    mark = len(read_request_log(HUB_STATE))
    granted = deploy(fresh, TOKEN_GRANTED)
    print(f"access granted, the drafter fetched and serving: {granted.wall_s:.0f} s")
    assert granted.returncode == 0, granted.output[-3000:]
    changed = {op for op, (_, success, _, _) in results_table(granted.output).items() if success != "-"}
    assert changed == {"Hugging Face token", "Weights", f"SGLang service {SERVER.service_name}",
                       f"SGLang generates {SERVER.service_name}", f"KV plan of {SERVER.service_name}"}, changed
    fetched = files_fetched_by(fresh, mark)
    assert fetched[WEIGHTS.target.repo_id] == set(), "a target file was fetched again"
    drafter_files = json.loads((HUB_STORE / "models" / WEIGHTS.drafter.repo_id / "manifest.json").read_text())["files"]
    assert fetched[WEIGHTS.drafter.repo_id] == {f["path"] for f in drafter_files}, fetched
    assert server_info(fresh)["speculative_algorithm"] == "DFLASH"


def test_a_serving_host_with_a_newly_denied_token_is_untouched(fresh):
    if fleet.ssh(fresh, f"systemctl is-active {SERVER.service_name}", check=False).strip() != "active":
        assert deploy(fresh, TOKEN_GRANTED).returncode == 0
    before = (main_pid(fresh, SERVER.service_name), fleet.ssh(fresh, f"sha1sum {SERVER.engine.service.hf_home}/token {SERVER.unit_file}"))
    denied = deploy(fresh, TOKEN_DENIED)
    assert denied.returncode != 0
    assert f"{fresh.name}: the token has no access to the gated repo {WEIGHTS.drafter.repo_id}" in denied.output
    assert "everything else is prepared" not in denied.output and "serves nothing yet" not in denied.output
    assert operations_started(denied.output) == ["Preflight"]
    assert (main_pid(fresh, SERVER.service_name),
            fleet.ssh(fresh, f"sha1sum {SERVER.engine.service.hf_home}/token {SERVER.unit_file}")) == before
    assert server_info(fresh)["speculative_algorithm"] == "DFLASH"
