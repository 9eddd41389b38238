"""A deploy file pyinfra runs with exec is named as a module's file (operations/basics/deploy_files.py), so
that `inspect`, which pyinfra's CLI asks for every operation call's stack, finds its frames by one lookup."""

import ast
import inspect
from pathlib import Path

from operations.basics import deploy_files

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
