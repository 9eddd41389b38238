"""A deploy file pyinfra runs with exec is named as a module's file (operations/basics/deploy_files.py), so
that `inspect`, which pyinfra's CLI asks for every operation call's stack, finds its frames by one lookup."""

import ast
import inspect
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from operations.basics import deploy_files
from tests.helpers import PYINFRA

REPO = Path(__file__).resolve().parents[2]


def frame_of_a_file_run_by_exec(path: Path):
    """A frame of code run as pyinfra runs a deploy file (pyinfra_cli/util.py exec_file)."""
    scope = {"__file__": str(path), "inspect": inspect}
    exec(compile("frame = inspect.currentframe()\n", str(path), "exec"), scope)
    return scope["frame"]


def test_a_named_deploy_files_frames_are_found_by_one_lookup_not_a_scan_of_every_module(tmp_path):
    path = tmp_path / "deploy.py"
    frame = frame_of_a_file_run_by_exec(path)
    assert inspect.getmodule(frame) is None  # no module's file: inspect scanned sys.modules, and found none
    deploy_files.named_for_inspect(str(path))
    module = inspect.getmodule(frame)
    assert module is not None and module.__file__ == str(path)
    # What a later lookup reads before it would scan (inspect.getmodule: `if file in modulesbyfile`).
    assert inspect.modulesbyfile[inspect.getabsfile(frame)] == module.__name__
    assert inspect.getmodule(frame) is module


def test_every_deploy_file_names_itself_before_its_first_operation():
    deploy_files_run_by_pyinfra = [path for path in REPO.glob("*.py")
                                   if "from pyinfra import host" in path.read_text()]
    names = {p.name for p in deploy_files_run_by_pyinfra}
    assert names >= {"deploy.py", "bench.py", "tune.py", "uninstall.py", "status.py", "logs.py"}
    for path in deploy_files_run_by_pyinfra:
        body = ast.parse(path.read_text()).body
        calls = [i for i, node in enumerate(body) if isinstance(node, ast.Expr)
                 and ast.unparse(node.value) == "deploy_files.named_for_inspect(__file__)"]
        first_statement = next(i for i, node in enumerate(body)
                               if not isinstance(node, (ast.Import, ast.ImportFrom)) and not (
                                   isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)))
        assert calls == [first_statement], path.name


@pytest.mark.parametrize("told_not_to", [False, True])
def test_a_deploy_run_keeps_its_modules_compiled_unless_the_interpreter_is_told_not_to(tmp_path, told_not_to):
    """pyinfra's CLI turns writing bytecode off for its whole process: without operations/__init__.py undoing
    that (deployment/__init__.py runs it first), every run compiled the deploy's modules from source again
    (speed/README.md, P1)."""
    for package in ("deployment", "operations"):
        shutil.copytree(REPO / package, tmp_path / package, ignore=shutil.ignore_patterns("__pycache__"))
    (tmp_path / "deploy.py").write_text("from deployment import network\n")
    env = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "PYTHONDONTWRITEBYTECODE")}
    if told_not_to:
        env["PYTHONDONTWRITEBYTECODE"] = "1"
    run = subprocess.run([str(PYINFRA), "-y", "@local", "deploy.py"], cwd=tmp_path, env=env, capture_output=True,
                         text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    compiled = sorted(path.name for path in (tmp_path / "deployment").glob("__pycache__/*.pyc"))
    assert compiled == ([] if told_not_to else [f"network.{sys.implementation.cache_tag}.pyc"])
