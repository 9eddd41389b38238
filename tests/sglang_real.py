"""The REAL SGLang 0.5.23 argument parser, for checking rendered command lines.

The real package cannot run here (no GPU, CUDA-only deps), but its parser can:
`sglang.srt.server_args` imports only light modules, so an env with the real
wheel installed `--no-deps` plus those modules (and a CPU torch) builds the
exact parser the servers use. The env lives in build/sglang-real/ and is built
once per clone; `python -m tests.sglang_real` builds it ahead of the tests.
"""

import fcntl
import json
import os
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
ENV_DIR = REPO_ROOT / "build" / "sglang-real"

SGLANG_PIN = "sglang==0.5.23"
# What `from sglang.srt.server_args import ServerArgs` imports, found by trial.
# torch is the CPU build on this machine's disk: the plain `torch==2.13.0`
# would let pip fall back to the multi-GB CUDA build from PyPI.
LIGHT_DEPS = [
    "torch==2.13.0+cpu",
    "triton==3.9.0",
    "numpy==2.4.6",
    "msgspec==0.23.0",
    "orjson==3.13.0",
    "psutil==7.2.2",
    "pybase64==1.5.1",
    "requests==2.34.2",
    "packaging==26.4",
    "pillow==13.0.0",
    "starlette==1.10.0",
    "pydantic==2.14.4",
    "pyzmq==27.3.0",
    "tqdm==4.70.1",
    "ipython==9.18.1",
    "aiohttp==3.14.5",
]
# The stamp holds the pins, so changing them rebuilds the env.
_STAMP = ENV_DIR / ".specfleet-complete"
_STAMP_TEXT = "\n".join([SGLANG_PIN, *LIGHT_DEPS]) + "\n"

# Builds the parser exactly as the real launch_server does and parses each argv
# of a JSON list; one process for many argvs, since importing takes seconds.
# The deploy validates on hosts with the same calls, so this snippet also
# works against the lab stand-in.
_PARSE_SNIPPET = r"""
import argparse, contextlib, io, json, sys
from sglang.srt.server_args import ServerArgs
results = []
for argv in json.loads(sys.argv[1]):
    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            ns = parser.parse_args(argv)
        results.append({"ok": True, "args": vars(ns)})
    except SystemExit as e:
        results.append({"ok": False, "code": e.code, "stderr": err.getvalue()})
print("@@RESULT@@" + json.dumps(results, default=repr))
"""


class RealSGLangRejected(ValueError):
    """The real parser rejected an argv; the message is its stderr."""


def real_sglang_python() -> Path:
    """The python of the real-parser env, building the env on first use."""
    python = ENV_DIR / "bin" / "python"
    if _stamp_ok():
        return python
    ENV_DIR.parent.mkdir(parents=True, exist_ok=True)
    # A lock, so parallel test workers build the env once.
    with open(ENV_DIR.parent / ".sglang-real.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not _stamp_ok():
            _build(python)
    return python


def _stamp_ok() -> bool:
    return _STAMP.is_file() and _STAMP.read_text() == _STAMP_TEXT


def _build(python: Path) -> None:
    _STAMP.unlink(missing_ok=True)
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(ENV_DIR)], check=True)
    pip = [str(python), "-m", "pip", "install", "--quiet"]
    subprocess.run([*pip, *LIGHT_DEPS], check=True)
    # --no-deps: the real wheel requires CUDA kernels and a GPU torch.
    subprocess.run([*pip, "--no-deps", SGLANG_PIN], check=True)
    _STAMP.write_text(_STAMP_TEXT)


def parse_many_with_real_sglang(argvs: list[list[str]]) -> list[dict]:
    """Parse each argv; per argv, {"ok": True, "args": {...}} or
    {"ok": False, "code": 2, "stderr": "..."}."""
    proc = subprocess.run(
        [str(real_sglang_python()), "-c", _PARSE_SNIPPET, json.dumps(argvs)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith("@@RESULT@@"):
            return json.loads(line[len("@@RESULT@@") :])
    raise RuntimeError(f"real sglang parser crashed:\n{proc.stderr}")


def parse_with_real_sglang(argv: list[str]) -> dict:
    """The parsed args as a dict; raises RealSGLangRejected on rejection."""
    (result,) = parse_many_with_real_sglang([argv])
    if not result["ok"]:
        raise RealSGLangRejected(result["stderr"])
    return result["args"]


if __name__ == "__main__":
    print(real_sglang_python())
