"""The SGLang stand-in's multi-node start (lab/sglang_standin/sglang/rendezvous.py), on loopback:
rank 0 serves only once every rank joined, a missing rank keeps it not serving, a rank that dies
takes it down, a port probe is no rank, the other ranks serve only the dummy health server and stop on
rank 0's graceful stop."""

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.gpu_standin_env import gpu_standin_env
from tests.lab_code.test_sglang_standin import python_path, write_models

STANDIN_SRC = Path(__file__).resolve().parents[2] / "lab" / "sglang_standin"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def node(tmp_path):
    """Start one node of a two-node stand-in server: node(rank) -> (process, http port)."""
    target, draft = write_models(tmp_path / "kimi", tmp_path / "kimi-dflash")
    dist_port, started = free_port(), []
    env = {**os.environ, "PYTHONPATH": python_path(STANDIN_SRC), "SPECFLEET_SGLANG_KNOBS": str(tmp_path / "none.json"),
           **gpu_standin_env(tmp_path / "gpu", "b200_nvlink")}

    def start(rank: int, new_session: bool = False, **extra_env) -> tuple[subprocess.Popen, int]:
        port = free_port()
        args = ["--model-path", str(target), "--speculative-algorithm", "DFLASH",
                "--speculative-draft-model-path", str(draft), "--attention-backend", "trtllm_mla",
                "--speculative-draft-attention-backend", "fa4", "--tp-size", "16", "--mem-fraction-static", "0.9",
                "--host", "127.0.0.1",
                "--port", str(port), "--nnodes", "2", "--node-rank", str(rank),
                "--dist-init-addr", f"127.0.0.1:{dist_port}"]
        process = subprocess.Popen([sys.executable, "-m", "sglang.launch_server", *args], env={**env, **extra_env},
                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                   start_new_session=new_session)
        started.append(process)
        return process, port

    start.dist_port = dist_port
    yield start
    for process in started:
        if process.poll() is None:
            process.kill()
            process.wait()


def answers(port: int) -> int | None:
    """/health's status, or None while nothing listens."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code
    except OSError:
        return None


def served(port: int, path: str) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code


def listening(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False


def wait_for(check, timeout: float = 10) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.1)
    return False


def test_rank0_serves_only_after_every_rank_joined(node):
    rank0, port = node(0)
    # A port probe (connect, close) is no rank: rank 0 still waits, and serves nothing.
    assert wait_for(lambda: listening(node.dist_port)), "rank 0 did not open the dist-init port"
    time.sleep(1.5)
    assert answers(port) is None and rank0.poll() is None

    rank1, rank1_port = node(1)
    assert wait_for(lambda: answers(port) == 200), "rank 0 did not serve after rank 1 joined"
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/server_info", timeout=2) as response:
        info = json.loads(response.read())
    assert (info["nnodes"], info["node_rank"], info["tp_size"]) == (2, 0, 16)
    # rank >= 1 serves the dummy health server alone (0.5.23 launch_dummy_health_check_server)
    assert wait_for(lambda: answers(rank1_port) == 200) and rank1.poll() is None
    assert served(rank1_port, "/v1/models") == 404 and served(rank1_port, "/health_generate") == 200


def test_a_rank_that_dies_takes_rank0_down(node):
    rank0, port = node(0)
    rank1, _ = node(1)
    assert wait_for(lambda: answers(port) == 200)
    rank1.kill()
    assert wait_for(lambda: rank0.poll() is not None, timeout=5), "rank 0 kept serving without rank 1"
    assert rank0.returncode == 1 and "Connection closed by peer" in rank0.stdout.read()


def test_rank0_going_away_takes_the_other_ranks_down(node):
    rank0, port = node(0)
    rank1, _ = node(1)
    assert wait_for(lambda: answers(port) == 200)
    rank0.kill()
    assert wait_for(lambda: rank1.poll() is not None, timeout=5) and rank1.returncode == 1


def test_an_interface_that_the_node_lacks_is_refused_as_nccl_does(node):
    rank0, _ = node(0, NCCL_SOCKET_IFNAME="ib-missing0")
    assert rank0.wait(timeout=10) == 1
    assert "no socket interface found" in rank0.stdout.read()


def test_other_ranks_ignore_sigterm_and_stop_on_rank0s_shutdown(node):
    """0.5.23 engine.py:1262-1273: a node of rank >= 1 only logs a SIGTERM and waits for rank 0's
    ShutdownReq broadcast, which rank 0 sends when its own graceful stop ends."""
    rank0, port = node(0)
    rank1, rank1_port = node(1)
    assert wait_for(lambda: answers(port) == 200 and answers(rank1_port) == 200)
    rank1.send_signal(signal.SIGTERM)
    time.sleep(1.5)
    assert rank1.poll() is None and answers(port) == 200
    rank0.send_signal(signal.SIGTERM)
    assert rank0.wait(timeout=15) == 0
    assert rank1.wait(timeout=5) == 0
    assert "waiting for the rank-0 ShutdownReq broadcast" in rank1.stdout.read()


def test_a_sigterm_to_all_of_a_node_ends_it_and_the_group(node):
    """systemd's KillMode=control-group on a rank-1 node: its schedulers die of the SIGTERM, so its
    main process stops waiting and exits, and rank 0 loses the node."""
    rank0, port = node(0)
    rank1, rank1_port = node(1, new_session=True)
    # Its health server answers once its SIGTERM handler is in (engine.py:1262-1285); before, a SIGTERM
    # kills the main process too.
    assert wait_for(lambda: answers(port) == 200 and answers(rank1_port) == 200)
    os.killpg(rank1.pid, signal.SIGTERM)
    assert rank1.wait(timeout=5) == 0
    assert rank0.wait(timeout=5) == 1
