"""The lab package index (lab/index.py): build, PEP 503 listing, real installs."""

import hashlib
import json
import os
import re
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from lab.index import HUB_LOCK, build, build_standin_wheel, standin_requirement, start_index
from tests.gpu_standin_env import gpu_standin_env

REPO_ROOT = Path(__file__).resolve().parents[2]
# The Makefile builds the index here too; the build skips what is present.
INDEX_DIR = REPO_ROOT / "build" / "lab-index"
PLAIN = "sglang-0.5.23+lab-py3-none-any.whl"
DDTREE = "sglang-0.5.23+lab.ddtree29907-py3-none-any.whl"


@pytest.fixture(scope="module")
def index():
    build(INDEX_DIR)
    server = start_index(INDEX_DIR, "127.0.0.1", 0)
    yield server
    server.stop()


def fetch(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def test_standin_wheels_are_reproducible(tmp_path):
    a = build_standin_wheel("0.5.23+lab", tmp_path)
    first = a.read_bytes()
    assert build_standin_wheel("0.5.23+lab", tmp_path).read_bytes() == first


def test_simple_index_lists_plain_standin_only(index):
    status, root = fetch(index.url)
    assert status == 200 and b'href="sglang/"' in root and b'href="huggingface-hub/"' in root
    status, page = fetch(index.url + "sglang/")
    links = re.findall(r'href="([^"]+)"', page.decode())
    assert status == 200 and len(links) == 1  # the DDTree build is URL-only
    href, digest = links[0].split("#sha256=")
    assert href == "../../wheels/sglang-0.5.23%2Blab-py3-none-any.whl"
    assert digest == hashlib.sha256((INDEX_DIR / "wheels" / PLAIN).read_bytes()).hexdigest()
    # Non-normalized names redirect, as PEP 503 suggests; urllib follows.
    assert fetch(index.url + "HuggingFace_Hub")[0] == 200
    assert fetch(index.url + "nosuchproject/")[0] == 404
    assert fetch(index.wheels_url + DDTREE)[0] == 200
    log = (INDEX_DIR / "requests.log").read_text()
    assert "GET /simple/nosuchproject/ 404\n" in log


def test_fresh_venv_installs_and_runs_standin(index, tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    py = venv / "bin" / "python"
    # Only the lab index: no pip config, find-links or extra index of this machine.
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env["PIP_CONFIG_FILE"] = os.devnull
    pip = [sys.executable, "-m", "pip", "--python", str(py), "install", "--quiet"]
    # As the hosts install them: every file checked against the deploy's committed lock, and the
    # stand-in against the hash the lab pins it to.
    (tmp_path / "standin.lock").write_text(standin_requirement("0.5.23+lab") + "\n")
    subprocess.run([*pip, "--index-url", index.url, "--require-hashes", "-r", HUB_LOCK,
                    "-r", tmp_path / "standin.lock"], env=env, check=True)
    version = "import sglang, huggingface_hub; print(sglang.__version__, huggingface_hub.__version__)"
    assert subprocess.check_output([py, "-c", version], text=True).split() == ["0.5.23+lab", "2.4.0"]

    target = tmp_path / "model"
    target.mkdir()
    (target / "config.json").write_text(json.dumps({  # a tiny Qwen3, complete enough to size a KV pool by
        "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 256, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64}))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen([py, "-m", "sglang.launch_server", "--model-path", str(target), "--port", str(port),
                               "--mem-fraction-static", "0.9"],
                              stdout=subprocess.PIPE, text=True,
                              env={**env, "SPECFLEET_SGLANG_KNOBS": str(tmp_path / "no-knobs.json"),
                                   **gpu_standin_env(tmp_path / "gpu", "b200_nvlink")})
    try:
        for line in server.stdout:
            if "fired up and ready to roll" in line:
                break
        status, body = fetch(f"http://127.0.0.1:{port}/model_info")
        assert status == 200 and json.loads(body)["model_type"] == "qwen3"
    finally:
        server.terminate()  # a graceful stop: the drain checks every 5 s
        server.wait(timeout=15)

    # A profile that wants DDTree installs the URL-only build by its URL.
    subprocess.run([*pip, index.wheels_url + DDTREE.replace("+", "%2B")], env=env, check=True)
    check = [py, "-m", "sglang.check_args", "--model-path", str(target), "--speculative-ddtree-budget", "15"]
    assert subprocess.run(check).returncode == 0


def test_a_wheel_that_differs_from_the_lock_is_refused(index, tmp_path):
    """The lock's hashes are what pip checks: one byte more in a served wheel and nothing installs."""
    tampered = tmp_path / "index"
    (tampered / "wheels").mkdir(parents=True)
    for whl in (INDEX_DIR / "wheels").glob("*.whl"):
        (tampered / "wheels" / whl.name).symlink_to(whl)
    hub_wheel = tampered / "wheels" / "huggingface_hub-2.4.0-py3-none-any.whl"
    hub_wheel.unlink()
    hub_wheel.write_bytes((INDEX_DIR / "wheels" / hub_wheel.name).read_bytes() + b"\0")
    server = start_index(tampered, "127.0.0.1", 0)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env["PIP_CONFIG_FILE"] = os.devnull
    try:
        refused = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-d", tmp_path / "got",
                                  "--index-url", server.url, "--require-hashes", "-r", HUB_LOCK],
                                 env=env, capture_output=True, text=True)
    finally:
        server.stop()
    assert refused.returncode != 0 and "DO NOT MATCH THE HASHES" in refused.stderr, refused.stderr


def test_the_hosts_wheels_are_downloaded_once_for_every_lab_and_every_clone(tmp_path, monkeypatch):
    """A second lab's index, and one built from another checkout of the same locks, link the first
    download: no pip runs again (keyed by the checkout's path, each clone downloaded them anew)."""
    from lab import index as lab_index

    downloads = []

    def pip_download(command, check):
        dest = Path(command[command.index("--dest") + 1])
        downloads.append(command)
        (dest / f"w{len(downloads)}-1.0-py3-none-any.whl").write_bytes(b"wheel")

    monkeypatch.setattr(lab_index, "CACHE_DIR", tmp_path / "cache", raising=False)
    monkeypatch.setattr(lab_index.subprocess, "run", pip_download)
    labs = [tmp_path / name for name in ("lab1", "lab2", "clone")]
    for wheels in labs:
        if wheels.name == "clone":
            lock = tmp_path / "clone-checkout" / HUB_LOCK.name
            lock.parent.mkdir()
            lock.write_text(HUB_LOCK.read_text())
            monkeypatch.setattr(lab_index, "HUB_LOCK", lock)
            monkeypatch.setattr(lab_index, "HUB_REQUIREMENTS", ["--require-hashes", "-r", str(lock)])
        wheels.mkdir()
        lab_index.download_host_wheels(wheels)
    assert len(downloads) == 4  # hub, uv, the bench client, the gateway: once
    for wheels in labs:
        assert sorted(p.name for p in wheels.iterdir()) == [f"w{i}-1.0-py3-none-any.whl" for i in range(1, 5)]
