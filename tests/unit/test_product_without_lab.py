"""The product runs from a copy of the repository that has no lab/: nothing outside the lab imports it."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import PYINFRA, REPO

PRODUCT = ["deploy.py", "deployment", "group_data", "inventory", "operations", "templates", "requirements.txt",
           "tools", "tests/fixtures/nvidia-smi/rtxpro6000se-8x-pcie"]


@pytest.fixture(scope="module")
def product(tmp_path_factory) -> Path:
    copy = tmp_path_factory.mktemp("product")
    for name in PRODUCT:
        source, target = REPO / name, copy / name
        if source.is_dir():
            shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(source, target)
    assert not (copy / "lab").exists()
    return copy


def run(command: list[str], cwd: Path) -> subprocess.CompletedProcess:
    # No token anywhere (HF_HOME is empty), no PYTHONPATH: only the copy is importable.
    env = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "HF_TOKEN")}
    env["HF_HOME"] = str(cwd / "hf-home")
    return subprocess.run(command, cwd=cwd, capture_output=True, text=True, env=env, timeout=300)


def test_dry_deploy_loads_group_data_and_runs_preflight_without_lab(product):
    """`@local` in a class group: pyinfra reads every group_data file and runs deploy.py. With no
    token on the controller, --dry prints the refusal the run would make and plans nothing after
    Preflight but the run's closing table; it changes nothing."""
    (product / "fake_inventory.py").write_text('rtx_pro_6000_pcie = [("@local", {})]\n')
    result = run([str(PYINFRA), "--dry", "fake_inventory.py", "deploy.py"], product)
    output = result.stdout + result.stderr
    assert "No module named 'lab'" not in output and "Traceback" not in output, output[-3000:]
    assert "Loading: deploy.py" in output, output[-3000:]
    planned = output.split("--> Detected changes:")[1].split("Detected changes may")[0]
    assert [line.split()[0] for line in planned.strip().splitlines()[1:]] == ["Preflight", "Summary"], output[-3000:]
    assert "@local: no Hugging Face token on the controller" in output.split("--> Detected changes:")[0]


def test_classify_runs_without_lab(product):
    capture = product / "tests/fixtures/nvidia-smi/rtxpro6000se-8x-pcie"
    result = run([sys.executable, "-m", "tools.gpu", "classify", str(capture)], product)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["host_class"] == "rtx_pro_6000_pcie"


def test_a_bad_gateway_knob_is_one_line_for_its_host_not_a_traceback_for_the_run(product):
    """pyinfra re-raises an exception from loading deploy.py for every host: a gateway's data is
    checked inside deploy.py's refusal, as a worker's is, so only its host fails (on `@local`
    the refusal is the only operation that acts, and it changes nothing)."""
    (product / "gateway_inventory.py").write_text('gateway = [("@local", {"gateway_port": "30080a"})]\n')
    result = run([str(PYINFRA), "-y", "gateway_inventory.py", "deploy.py"], product)
    output = result.stdout + result.stderr
    assert result.returncode != 0 and "Traceback" not in output, output[-3000:]
    assert "@local: gateway_port='30080a' is not a whole number from 1 to 65535" in output, output[-3000:]
