"""The REAL SGLang 0.5.23, for checking rendered command lines: its parser and its resolution.

The real package cannot serve here (no GPU), but everything up to loading the model can run:
its argument parser and `ServerArgs.resolve_once`, the post-init hooks that reject or rewrite
what argparse accepts (tests/sglang_real_gpu.py presents a host class's GPU to them).

The env is the real wheel installed `--no-deps` plus what its resolution path imports, all from
PyPI (found by trial; a fresh Debian 12 machine reaching only PyPI builds it): torch is PyPI's
torch==2.14.1, the version the wheel pins, and for Linux that is the CUDA build with its nvidia-*
libraries (~5.6 GB installed; importing it needs no GPU). It is built once per machine and pin set
under the cache directory (SPECFLEET_CACHE, else /var/cache/specfleet, else ~/.cache/specfleet),
outside any checkout, so a fresh clone reuses it. `python -m tests.sglang_real` builds it ahead.
"""

import fcntl
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
SGLANG_PIN = "sglang==0.5.23"
# What the resolution path (server_args, arg_groups, configs, model_loader) imports.
RESOLUTION_DEPS = [
    "torch==2.14.1",  # sglang 0.5.23 pins it; PyPI's Linux wheel is the CUDA build
    "torchvision==0.29.2",
    "transformers==5.19.0",  # pinned by the wheel; reads the model configs
    "apache-tvm-ffi==0.1.11",
    "sentencepiece==0.2.1",
    "compressed-tensors==0.20.1",
    "gguf==0.19.0",
    "dill==0.4.1",
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
PINS = [SGLANG_PIN, *RESOLUTION_DEPS]
KEY = hashlib.sha256("\n".join(PINS).encode()).hexdigest()[:16]
# What the serving code the conformance suite drives (entrypoints/openai/protocol.py, parser/,
# observability/) imports beyond the resolution path, pinned as the wheel pins them where it does
# (openai==2.8.0; prometheus-client>=0.20.0), found by trial. Installed --no-deps into a folder of its
# own on the env's PYTHONPATH, so the env itself (and its torch) is reused as it is.
SERVING_DEPS = [
    "openai==2.8.0", "httpx==0.28.1", "httpcore==1.0.9", "h11==0.16.0", "certifi==2026.10.19.post1",
    "idna==3.20", "anyio==4.16.0", "sniffio==1.3.1", "distro==1.9.0", "jiter==0.19.0",
    "partial_json_parser==0.2.1.1.post7", "prometheus-client==0.21.1",
]


def cache_root() -> Path:
    if os.environ.get("SPECFLEET_CACHE"):
        return Path(os.environ["SPECFLEET_CACHE"])
    system = Path("/var/cache/specfleet")
    if os.access(system if system.exists() else system.parent, os.W_OK):
        return system
    return Path.home() / ".cache" / "specfleet"


ENV_DIR = cache_root() / f"sglang-real-{KEY}"
_STAMP = ENV_DIR / ".specfleet-complete"
_STAMP_TEXT = "\n".join(PINS) + "\n"
SERVING_DIR = cache_root() / f"sglang-serving-{hashlib.sha256(chr(10).join(SERVING_DEPS).encode()).hexdigest()[:16]}"

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
    # A lock, so parallel test runs (other clones on this machine) build the env once.
    with open(ENV_DIR.parent / f".sglang-real-{KEY}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not _stamp_ok():
            _build(python)
    return python


def _stamp_ok() -> bool:
    return _STAMP.is_file() and _STAMP.read_text() == _STAMP_TEXT


def _build(python: Path) -> None:
    _STAMP.unlink(missing_ok=True)
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(ENV_DIR)], check=True)
    pip = [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--only-binary=:all:"]
    subprocess.run([*pip, *RESOLUTION_DEPS], check=True)
    # --no-deps: the rest of what the wheel requires serves models (CUDA kernels), not arguments.
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


def resolve_many_with_real_sglang(cases: list[dict]) -> list[dict]:
    """Resolve each case {"argv", "env", "gpu": {name, compute_capability, count, memory_mib}} as the
    deploy's host check does (operations.sglang.RESOLVE) on a host with that GPU; per case
    {"resolved": {...}}, {"error": "..."} or {"parsed_only": True} (no config.json at the paths)."""
    from operations.server.flags import RESOLVE

    proc = subprocess.run(
        [str(real_sglang_python()), str(REPO_ROOT / "tests" / "sglang_real_gpu.py"), RESOLVE],
        input=json.dumps(cases), capture_output=True, text=True, cwd="/",
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith("@@CASES@@"):
            return json.loads(line[len("@@CASES@@"):])
    raise RuntimeError(f"real sglang resolution crashed:\n{proc.stderr[-4000:]}")


def serving_pythonpath() -> Path:
    """The folder of SERVING_DEPS for the real env's PYTHONPATH, installed on first use."""
    python = real_sglang_python()
    stamp = SERVING_DIR / ".specfleet-complete"
    if not stamp.is_file():
        with open(SERVING_DIR.parent / f".{SERVING_DIR.name}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not stamp.is_file():
                subprocess.run([str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                                "--only-binary=:all:", "--no-deps", "--upgrade", "--target", str(SERVING_DIR),
                                *SERVING_DEPS], check=True)
                stamp.write_text("\n".join(SERVING_DEPS) + "\n")
    return SERVING_DIR


def run_with_real_sglang(script: Path, payload) -> dict:
    """Run `script` (a file of tests/) in the real env with SGLang's serving code importable, `payload` as
    JSON on its stdin; its answer is the JSON on its last line starting @@RESULT@@."""
    proc = subprocess.run(
        [str(real_sglang_python()), str(script)], input=json.dumps(payload), capture_output=True, text=True,
        cwd="/", env={**os.environ, "PYTHONWARNINGS": "ignore", "PYTHONPATH": str(serving_pythonpath())},
    )
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith("@@RESULT@@"):
            return json.loads(line[len("@@RESULT@@"):])
    raise RuntimeError(f"{script.name} in the real sglang env crashed:\n{proc.stderr[-4000:]}")


if __name__ == "__main__":
    print(real_sglang_python())
