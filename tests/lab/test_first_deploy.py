"""Every shipped profile as the first deploy on a freshly booted host of each class.

A lab of its own (lab id + 20, booted in parallel from the cached roots, torn down after) holds
a fleet serving two models at once, as a real inventory's host data would make it: Kimi K2.6 with
DFlash (the default profile) on a PCIe host behind the gateway, as `make demo` shows it; Qwen3.6
with DDTree on another PCIe host and a B200 host; and one more PCIe host whose DDTree profile
points at an SGLang without DDTree, which must be refused in one line. The default profile's first
deploy on a fresh B200 host is every worker's shared lab (conftest.py's deployed_lab, asserted by
tests/lab/test_deploy.py), so the matrix does not boot one more for it. None of them was ever
deployed before: no virtualenv, no unit, no weights, no key. Each cell converges or is refused
in one line, never with a traceback, and a second run changes nothing.
"""

import os
import re
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from lab.config import LAB_ID
from tests.helpers import LAB_INVENTORY, PYINFRA, REPO, changed_operations, operations_started, results_table, write_group_data

pytestmark = pytest.mark.lab

MATRIX_LAB = LAB_ID + 20
KEY = "lab-first-deploy-matrix-key"  # the gateway's workers listen on the lab network: they need one
ADMIN_KEY = "lab-first-deploy-matrix-admin-key"  # and the gateway's control plane one of its own
CONVERGE = {  # host -> (profile, class), every one converging on its first deploy
    "lab-pcie-1": ("kimi_k26_dflash", "rtx_pro_6000_pcie"),
    "lab-pcie-2": ("qwen36_ddtree", "rtx_pro_6000_pcie"),
    "lab-b200-1": ("qwen36_ddtree", "b200_nvlink"),
    "lab-gateway-1": ("kimi_k26_dflash", "gateway"),
}
REFUSED = "lab-pcie-3"  # qwen36_ddtree, with an SGLang that has no DDTree
PROFILES = "lab-pcie-2=qwen36_ddtree,lab-b200-1=qwen36_ddtree,lab-pcie-3=qwen36_ddtree"
ENV = {**os.environ, "SPECFLEET_LAB_ID": str(MATRIX_LAB), "SPECFLEET_LAB_PROFILES": PROFILES,
       "HF_TOKEN": "hf_lab_granted", "SPECFLEET_API_KEY": KEY, "SPECFLEET_GATEWAY_ADMIN_KEY": ADMIN_KEY}


def lab(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "lab", *args], cwd=REPO, env=ENV, check=True, capture_output=True)


def deploy(hosts, *args: str) -> subprocess.Popen:
    limits = [arg for host in hosts for arg in ("--limit", host)]
    return subprocess.Popen([str(PYINFRA), "-y", *args, LAB_INVENTORY, "deploy.py", *limits], cwd=REPO, env=ENV,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def together(*runs: subprocess.Popen) -> list[tuple[subprocess.Popen, str, float]]:
    """Wait for runs started together: each with its output and its own wall time."""
    started = time.monotonic()

    def finish(run):
        output = run.communicate(timeout=600)[0]
        return run, output, time.monotonic() - started

    with ThreadPoolExecutor(len(runs)) as pool:
        return list(pool.map(finish, runs))


@pytest.fixture(scope="module")
def matrix(tmp_path_factory):
    """Both runs of the matrix: [(first converge, first refusal), (second converge, second refusal)]."""
    no_ddtree = write_group_data(tmp_path_factory.mktemp("no-ddtree"), "lab", (
        "from lab.config import WHEELS_URL\n"
        "mirrors = copy.deepcopy(base['mirrors'])\n"
        "mirrors['requirements'] = {r: f'sglang @ {WHEELS_URL}sglang-0.5.23+lab-py3-none-any.whl' "
        "for r in mirrors['requirements']}"))
    lab("down")
    lab("up", "--hosts", "pcie=3,b200=1,gateway=1")
    try:
        rounds = []
        for _ in range(2):
            rounds.append(together(deploy(CONVERGE), deploy([REFUSED], "--group-data", str(no_ddtree))))
        yield rounds
    finally:
        lab("down")


def test_no_first_deploy_ends_in_a_traceback(matrix):
    for run, output, _ in (cell for round_ in matrix for cell in round_):
        assert "Traceback" not in output and "unexpected" not in output, output[-4000:]


def test_every_shipped_profile_converges_on_a_fresh_host_of_each_class(matrix):
    (run, output, seconds), _ = matrix[0]
    print(f"\nfirst deploy of {len(CONVERGE)} fresh hosts "
          f"({', '.join(f'{h}: {p} on {c}' for h, (p, c) in CONVERGE.items())}): {seconds:.0f} s")
    assert run.returncode == 0, output[-4000:]
    for host, (profile, host_class) in CONVERGE.items():
        if host_class == "gateway":
            continue
        algorithm = "DDTREE" if profile == "qwen36_ddtree" else "DFLASH"
        assert re.search(rf"\[{host}\] +serving {algorithm} .*accept length", output), f"{host}: {profile}"
    rows = results_table(output)
    assert rows["Gateway workers"][1:3] == ["1", "-"]  # the Kimi workers registered with the gateway
    assert rows["Prometheus targets up"][1:3] == ["1", "-"]


def refusal(output: str) -> str:
    """The one line refusing REFUSED."""
    [problem] = [line for line in output.splitlines() if re.search(rf"\[{REFUSED}\] +{REFUSED}: ", line)]
    return problem


def test_a_ddtree_profile_on_an_sglang_without_ddtree_is_refused_in_one_line(matrix):
    _, (run, output, seconds) = matrix[0]
    print(f"\nqwen36_ddtree on {REFUSED} with an SGLang without DDTree, refused in {seconds:.0f} s:\n"
          f"{refusal(output)}")
    assert run.returncode != 0
    assert "rejects" in refusal(output) and "--speculative-ddtree-budget" in refusal(output)


def test_a_second_run_of_each_changes_nothing(matrix):
    (converged, output, seconds), (refused, second, _) = matrix[1]
    print(f"\nsecond run over the converged hosts: {seconds:.0f} s")
    assert converged.returncode == 0, output[-4000:]
    assert changed_operations(output) == [], "changed on a second run"
    print(f"second run of {REFUSED}:\n{refusal(second)}")
    assert refused.returncode != 0 and "--speculative-ddtree-budget" in refusal(second)
    # With its SGLang installed, preflight itself refuses it: nothing after it starts.
    assert operations_started(second) == ["Preflight"], second[-4000:]
