"""The lab's SGLang stand-in (lab/sglang_standin): parser truth and server."""

import http.client
import itertools
import json
import os
import runpy
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import zipfile
from pathlib import Path
from types import SimpleNamespace

import pytest

from lab.index import build_standin_wheel
from lab.repos import KIMI_TEXT_CONFIG, QWEN_CONFIG
from lab.sglang_standin.sglang import speed_model
from deployment.server import speculative
from tests.gpu_standin_env import gpu_standin_env
from tests.sglang_real import parse_many_with_real_sglang

STANDIN_SRC = Path(__file__).resolve().parents[2] / "lab" / "sglang_standin"
# The lab's torch, which the wheel ships beside the stand-in: the engine asks it which link its TP ranks take.
TORCH_STANDIN = STANDIN_SRC.parent / "torch_standin"

# Real-looking DFlash command lines, one per hardware class.
KIMI_SM120 = [  # RTX PRO 6000: flashinfer target, flashinfer draft
    "--model-path", "/models/kimi", "--tp-size", "8", "--trust-remote-code",
    "--attention-backend", "flashinfer", "--speculative-algorithm", "DFLASH",
    "--speculative-draft-model-path", "/models/kimi-dflash", "--speculative-num-draft-tokens", "8",
    "--speculative-draft-attention-backend", "flashinfer", "--speculative-draft-window-size", "4096",
    "--mem-fraction-static", "0.94", "--chunked-prefill-size", "8092", "--cuda-graph-max-bs-decode", "16",
    "--reasoning-parser", "kimi_k2", "--tool-call-parser", "kimi_k2", "--host", "0.0.0.0", "--port", "30000",
]
KIMI_SM120_TRITON = [a.replace("flashinfer", "triton") for a in KIMI_SM120]
KIMI_SM100 = [  # B200/B300: trtllm_mla target, fa4 draft
    "--model-path", "/models/kimi", "--tp-size", "8", "--trust-remote-code",
    "--attention-backend", "trtllm_mla", "--speculative-algorithm", "DFLASH",
    "--speculative-draft-model-path", "/models/kimi-dflash", "--speculative-num-draft-tokens", "8",
    "--speculative-draft-attention-backend", "fa4", "--mem-fraction-static", "0.9",
    "--speculative-draft-window-size", "4096", "--enable-metrics", "--api-key", "lab-key",
]
QWEN_SM100 = [
    "--model-path", "/models/qwen", "--speculative-algorithm", "DFLASH",
    "--speculative-draft-model-path", "/models/qwen-dflash", "--speculative-num-draft-tokens", "16",
    "--attention-backend", "trtllm_mha", "--speculative-draft-attention-backend", "fa4",
    "--mamba-radix-cache-strategy", "extra_buffer", "--mem-fraction-static", "0.75",
    "--context-length", "256k", "--trust-remote-code",
]
ACCEPTED = [KIMI_SM120, KIMI_SM120_TRITON, KIMI_SM100, QWEN_SM100,
            ["--model-path", "/m", "--speculative-algorithm", "DDTREE"]]  # free string
REJECTED = [
    KIMI_SM100 + ["--speculative-draft-attenton-backend", "fa4"],  # misspelled
    KIMI_SM100 + ["--speculative-ddtree-budget", "15"],  # PR #29907, not released
    KIMI_SM100 + ["--speculative-dflash-draft-window-size", "4096"],  # removed in 0.5.20
    KIMI_SM100[:-2] + ["--attention-backend", "trtllm_mla_typo"],  # bad choice
    KIMI_SM100 + ["--speculative-num-draft-tokens", "eight"],  # bad type
    ["--tp-size", "8"],  # --model-path is required
    # The community SM120 recipe's flag is ambiguous in 0.5.23 (-decode/-prefill).
    KIMI_SM120 + ["--cuda-graph-max-bs", "16"],
]


@pytest.fixture(autouse=True)
def b200_gpu(tmp_path, monkeypatch):
    """The GPU stand-in's nvidia-smi on PATH, showing 8 B200s: the engine reads its GPU from it."""
    for key, value in gpu_standin_env(tmp_path / "gpu", "b200_nvlink").items():
        monkeypatch.setenv(key, value)


@pytest.fixture(scope="module")
def ddtree_src(tmp_path_factory) -> Path:
    """The DDTree build, unpacked: what the wheel puts in site-packages."""
    out = tmp_path_factory.mktemp("ddtree")
    whl = build_standin_wheel("0.5.23+lab.ddtree29907", out)
    zipfile.ZipFile(whl).extractall(out / "site")
    return out / "site"


def python_path(src: Path) -> str:
    """PYTHONPATH of a stand-in engine run from `src`, as the wheel installs it: with the lab's torch."""
    return os.pathsep.join([str(src), str(TORCH_STANDIN)])


# The stand-in's startup (srt/kv_pool.py) in its own package, as a lab host's engine runs it: per case
# {"args": resolved server arguments, "card_mib"}, its figures or its refusal.
STARTUP_SNIPPET = r"""
import json, sys
from types import SimpleNamespace
from sglang.srt import kv_pool
out = []
for case in json.load(sys.stdin):
    try:
        sized = kv_pool.startup(SimpleNamespace(**case["args"]), case["card_mib"])
        out.append({"max_total_num_tokens": sized.max_total_num_tokens,
                    "max_running_requests": sized.max_running_requests, "max_req_len": sized.max_req_len,
                    "context_len": sized.context_len})
    except Exception as exc:
        out.append({"error": f"{type(exc).__name__}: {exc}"})
print("@@RESULT@@" + json.dumps(out))
"""


def standin_startup(cases: list[dict], knobs: Path | None = None) -> list[dict]:
    knobs_env = {"SPECFLEET_SGLANG_KNOBS": str(knobs)} if knobs else {}
    proc = subprocess.run([sys.executable, "-c", STARTUP_SNIPPET], input=json.dumps(cases), capture_output=True,
                          text=True, env={**os.environ, "PYTHONPATH": python_path(STANDIN_SRC), **knobs_env})
    lines = [line for line in proc.stdout.splitlines() if line.startswith("@@RESULT@@")]
    assert lines, proc.stderr[-3000:]
    return json.loads(lines[-1][len("@@RESULT@@"):])


def run_module(src: Path, module: str, args: list[str], **kw) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": python_path(src), **kw.pop("env", {})}
    return subprocess.run([sys.executable, "-m", module, *args], env=env,
                          capture_output=True, text=True, **kw)


@pytest.mark.parametrize("argv", ACCEPTED)
def test_plain_build_accepts_real_command_lines(argv):
    assert run_module(STANDIN_SRC, "sglang.check_args", argv).returncode == 0


@pytest.mark.parametrize("argv", REJECTED)
def test_plain_build_rejects_like_argparse(argv):
    proc = run_module(STANDIN_SRC, "sglang.check_args", argv)
    assert proc.returncode == 2
    assert "error: " in proc.stderr.splitlines()[-1]


def test_ddtree_build_accepts_the_budget(ddtree_src):
    argv = KIMI_SM100 + ["--speculative-algorithm", "DDTREE", "--speculative-ddtree-budget", "15"]
    assert run_module(ddtree_src, "sglang.check_args", argv).returncode == 0
    assert run_module(ddtree_src, "sglang.check_args", argv + ["--speculative-ddtree-budget", "x"]).returncode == 2


def test_stand_in_agrees_with_the_real_parser():
    """Same accept/reject and the same parsed values as the real 0.5.23."""
    snippet = (
        "import argparse, json, sys\n"
        "from sglang.srt.server_args import ServerArgs\n"
        "p = argparse.ArgumentParser(); ServerArgs.add_cli_args(p)\n"
        "print(json.dumps(vars(p.parse_args(sys.argv[1:]))))\n"
    )
    real = parse_many_with_real_sglang(ACCEPTED + REJECTED)
    assert [r["ok"] for r in real] == [True] * len(ACCEPTED) + [False] * len(REJECTED)
    for argv, r in zip(ACCEPTED, real):
        proc = subprocess.run([sys.executable, "-c", snippet, *argv], capture_output=True, text=True,
                              env={**os.environ, "PYTHONPATH": str(STANDIN_SRC)}, check=True)
        assert json.loads(proc.stdout) == r["args"]


# --- the server -----------------------------------------------------------


# The lab hub's tiny Kimi K2.6 and a DFlash drafter of its shape (lab/repos.py): configs as complete as the
# real engine reads them, which sizes its KV pool from them.
KIMI_CONFIG = {"architectures": ["KimiK25ForConditionalGeneration"], "model_type": "kimi_k25",
               "text_config": KIMI_TEXT_CONFIG}
DRAFT_CONFIG = {"architectures": ["DFlashDraftModel"], "model_type": "qwen3", "hidden_size": 512,
                "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64,
                "dflash_config": {"block_size": 8}, "torch_dtype": "bfloat16"}


def write_models(target: Path, draft: Path) -> tuple[Path, Path]:
    for folder, config in ((target, KIMI_CONFIG), (draft, DRAFT_CONFIG)):
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps(config))
    return target, draft


@pytest.fixture
def models(tmp_path) -> tuple[Path, Path]:
    return write_models(tmp_path / "kimi", tmp_path / "kimi-dflash")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Standin:
    """A launch_server subprocess and an HTTP client for it."""

    def __init__(self, src: Path, args: list[str], knobs: Path, env: dict | None = None, new_session: bool = False):
        self.port = free_port()
        env = {**os.environ, "PYTHONPATH": python_path(src), "SPECFLEET_SGLANG_KNOBS": str(knobs), **(env or {})}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "sglang.launch_server", *args, "--port", str(self.port)],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=new_session)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and self.proc.poll() is None:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                time.sleep(0.05)
        raise AssertionError(f"stand-in did not listen: {self.proc.communicate()}")

    def get(self, path: str, body=None, key=None) -> tuple[int, str]:
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}",
                                     data=json.dumps(body).encode() if body is not None else None)
        if key:
            req.add_header("Authorization", f"Bearer {key}")
        try:
            with urllib.request.urlopen(req, timeout=5) as resp:
                return resp.status, resp.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()

    def wait_ready(self) -> None:
        assert self.proc.stdout.readline().startswith("[lab stand-in sglang")
        assert self.proc.stdout.readline().strip() == "The server is fired up and ready to roll!"

    def stop(self) -> tuple[str, str]:
        self.proc.terminate()  # a graceful stop: the drain checks every 5 s
        return self.proc.communicate(timeout=20)


@pytest.fixture
def start(tmp_path):
    servers = []
    knobs = tmp_path / "knobs.json"

    def _start(args, src=STANDIN_SRC, env=None, new_session=False, **knob_values):
        knobs.write_text(json.dumps(knob_values))
        servers.append(Standin(src, args, knobs, env, new_session))
        return servers[-1]

    _start.knobs = knobs
    yield _start
    for s in servers:
        if s.proc.poll() is None:
            s.proc.kill()  # its children follow (PR_SET_PDEATHSIG)
            s.proc.communicate()


def dflash_args(models, *extra):
    target, draft = models
    return ["--model-path", str(target), "--speculative-algorithm", "DFLASH",
            "--speculative-draft-model-path", str(draft), "--attention-backend", "trtllm_mla",
            "--speculative-draft-attention-backend", "fa4", "--mem-fraction-static", "0.9", "--tp-size", "8",
            *extra]


def test_endpoints(start, models):
    s = start(dflash_args(models, "--enable-metrics", "--api-key", "lab-key"))
    s.wait_ready()
    assert s.get("/health")[0] == 200  # health needs no key, like the real one
    assert s.get("/server_info")[0] == 401
    code, body = s.get("/server_info", key="lab-key")
    info = json.loads(body)
    assert code == 200 and info["version"] == "0.5.23+lab"
    # DFlash takes its block size from the drafter's dflash_config.
    assert info["speculative_num_draft_tokens"] == 8
    assert info["attention_backend"] == "trtllm_mla" and info["tp_size"] == 8
    assert info["speculative_draft_attention_backend"] == "fa4"
    # As the real build_server_info: the key itself, and the argv that carried it.
    assert info["api_key"] == "lab-key" and "--api-key lab-key" in info["launch_command"]
    # Its KV pool sized from the GPU stand-in's B200 (183,359 MiB) at its own resolved arguments, as SGLang
    # sizes it (srt/kv_pool.py, checked against the wheel in test_sglang_kv_pool.py); no weights in the folders.
    (sized,) = standin_startup([{"args": info, "card_mib": 183359}])
    assert info["max_total_num_tokens"] == sized["max_total_num_tokens"] > 100_000_000
    assert info["max_req_input_len"] == sized["max_req_len"] - 5  # managers/tp_worker.py
    assert info["internal_states"][0]["effective_max_running_requests_per_dp"] == sized["max_running_requests"]
    assert info["page_size"] == 64  # trtllm_mla's pages, as 0.5.23 resolves them
    assert set(speculative.DFLASH.server_info) <= set(info)  # the fields the table says report its settings
    accept = info["internal_states"][0]["avg_spec_accept_length"]
    assert accept == pytest.approx(1 + 0.35 * 7)

    model_info = json.loads(s.get("/model_info", key="lab-key")[1])
    assert model_info["architectures"] == ["KimiK25ForConditionalGeneration"]
    assert model_info["served_model_name"] == str(models[0])
    models_list = json.loads(s.get("/v1/models", key="lab-key")[1])
    assert models_list["data"][0]["max_model_len"] == 262144  # from text_config

    chat = {"model": "x", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}
    first = json.loads(s.get("/v1/chat/completions", chat, key="lab-key")[1])
    again = json.loads(s.get("/v1/chat/completions", chat, key="lab-key")[1])
    assert first["choices"][0]["message"]["content"] == again["choices"][0]["message"]["content"]
    assert first["usage"]["completion_tokens"] == 5
    gen = json.loads(s.get("/generate", {"text": "hi", "sampling_params": {"max_new_tokens": 8}}, key="lab-key")[1])
    assert gen["meta_info"]["spec_accept_length"] == accept
    assert gen["meta_info"]["spec_verify_ct"] >= 1
    assert (f'sglang:spec_accept_length{{model_name="{models[0]}",engine_type="unified",tp_rank="0",pp_rank="0",'
            f'moe_ep_rank="0"}} {accept}') in s.get("/metrics")[1]
    # Streamed: the role first, one event a decode step, the finish alone, the text the same as the whole answer's.
    events = stream_chat(s.port, {**chat, "stream": True, "max_tokens": 12}, key="lab-key")
    whole = json.loads(s.get("/v1/chat/completions", {**chat, "max_tokens": 12}, key="lab-key")[1])
    assert events[0]["choices"][0]["delta"] == {"reasoning_content": None, "role": "assistant", "content": ""}
    assert all(set(e["choices"][0]["delta"]) == {"reasoning_content", "content"} for e in events[1:-1])
    assert len(events) > 3 and events[-1]["choices"][0] == {
        "index": 0, "delta": {"reasoning_content": None}, "logprobs": None, "finish_reason": "length", "matched_stop": None}
    assert "".join(e["choices"][0]["delta"].get("content") or "" for e in events) == \
        whole["choices"][0]["message"]["content"]
    assert not any("usage" in e for e in events) and {e["model"] for e in events} == {"x"}

    out, err = s.stop()
    assert "lab-key" not in out + err


def test_metrics_only_when_enabled(start, models):
    s = start(dflash_args(models))
    s.wait_ready()
    assert s.get("/metrics")[0] == 404


def test_ddtree_on_the_ddtree_build(start, models, ddtree_src):
    args = dflash_args(models) + ["--speculative-algorithm", "DDTREE", "--attention-backend", "triton"]
    s = start(args, src=ddtree_src)
    s.wait_ready()
    info = json.loads(s.get("/server_info")[1])
    assert info["version"] == "0.5.23+lab.ddtree29907"
    assert info["speculative_ddtree_budget"] == 7  # block_size - 1
    assert set(speculative.DDTREE.server_info) <= set(info)
    assert info["page_size"] == 1 and info["disable_overlap_schedule"] is True
    # Its default budget, draft tokens - 1, is spine mode: the chain DFlash verifies, accepted alike.
    assert info["internal_states"][0]["avg_spec_accept_length"] == speed_model.accept_length(KIMI, "DFLASH", 8, None)


@pytest.mark.parametrize("pages", [["--attention-backend", "triton", "--page-size", "16"],
                                   ["--attention-backend", "trtllm_mha", "--page-size", "1"]])
def test_ddtree_build_refuses_pages_over_one(models, ddtree_src, pages):
    args = dflash_args(models) + ["--speculative-algorithm", "DDTREE", *pages]
    proc = run_module(ddtree_src, "sglang.launch_server", args, timeout=10)
    assert proc.returncode == 1 and "DDTREE currently supports only page_size == 1" in proc.stderr


def test_no_gpu_no_server(models, monkeypatch):
    monkeypatch.setenv("SPECFLEET_GPU_PROFILE_FILE", "/nonexistent")  # nvidia-smi: no driver
    proc = run_module(STANDIN_SRC, "sglang.launch_server", dflash_args(models), timeout=10)
    assert proc.returncode == 1 and "No accelerator (CUDA" in proc.stderr


def compute_apps() -> list[list[str]]:
    """What the nvidia-smi stand-in lists as processes holding a GPU: [pid, bus id]."""
    out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,gpu_bus_id", "--format=csv,noheader"],
                         capture_output=True, text=True, check=True).stdout
    return [line.split(", ") for line in out.splitlines()]


def bus_ids() -> list[str]:
    out = subprocess.run(["nvidia-smi", "--query-gpu=pci.bus_id", "--format=csv,noheader"], capture_output=True,
                         text=True, check=True).stdout
    return out.split()


def test_each_tp_rank_holds_the_visible_gpu_0_5_23_gives_it_and_nvidia_smi_lists_it(start, models, monkeypatch):
    """Two ranks with CUDA_VISIBLE_DEVICES=5,6: rank r on visible GPU r (engine.py: base_gpu_id + rank *
    gpu_id_step), held by a scheduler process of the server's, as the real tool lists the schedulers."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "5,6")
    s = start(dflash_args(models)[:-2] + ["--tp-size", "2"])
    s.wait_ready()
    held = [app for app in compute_apps() if int(app[0]) in children_of(s.proc.pid)]
    titles = [Path(f"/proc/{pid}/comm").read_text().strip() for pid, _ in held]
    assert [(title, bus) for title, (_, bus) in zip(titles, held)] == [("sglang::schedul", bus_ids()[5]),
                                                                       ("sglang::schedul", bus_ids()[6])]
    s.stop()
    time.sleep(0.2)
    assert not [app for app in compute_apps() if int(app[0]) in {int(a[0]) for a in held}]  # gone with the server


def children_of(pid: int) -> set[int]:
    found = set()
    for entry in os.listdir("/proc"):
        try:
            if entry.isdigit() and int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                found.add(int(entry))
        except OSError:
            continue
    return found


@pytest.mark.parametrize("visible, tp, base", [("3", "2", "0"), ("0,1", "1", "2"), ("2,9,4", "2", "0")])
def test_a_rank_whose_gpu_cuda_does_not_show_dies_as_the_real_scheduler_does(models, visible, tp, base):
    """A TP rank past the visible GPUs (an index CUDA cannot see cuts the list there): the scheduler's
    set_device raises, it SIGQUITs the server, which kills its tree and itself (SIGKILL)."""
    args = dflash_args(models)[:-2] + ["--tp-size", tp, "--base-gpu-id", base]
    proc = run_module(STANDIN_SRC, "sglang.launch_server", args, timeout=10, env={"CUDA_VISIBLE_DEVICES": visible})
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert "RuntimeError: CUDA error: invalid device ordinal" in proc.stderr
    assert "kill_process_tree called" in proc.stderr


def test_no_visible_gpu_no_server(models):
    proc = run_module(STANDIN_SRC, "sglang.launch_server", dflash_args(models), timeout=10,
                      env={"CUDA_VISIBLE_DEVICES": ""})
    assert proc.returncode == 1 and "No accelerator (CUDA" in proc.stderr


def test_ddtree_parses_but_fails_to_start_on_plain_build(models):
    proc = run_module(STANDIN_SRC, "sglang.launch_server",
                      dflash_args(models) + ["--speculative-algorithm", "DDTREE"], timeout=10)
    assert proc.returncode == 1
    assert "Unknown speculative algorithm name: DDTREE" in proc.stderr


@pytest.mark.parametrize("which", ["target", "draft"])
def test_missing_model_dir_fails(models, which, tmp_path):
    target, draft = models
    missing = tmp_path / "absent"
    args = dflash_args((missing, draft) if which == "target" else (target, missing))
    proc = run_module(STANDIN_SRC, "sglang.launch_server", args, timeout=10)
    assert proc.returncode == 1
    assert f"OSError: {missing} does not appear to have a file named config.json" in proc.stderr


def test_startup_delay_and_health_fail_knobs(start, models):
    s = start(dflash_args(models), startup_delay_s=0.5)
    assert s.get("/health")[0] == 503  # starting
    assert s.get("/generate", {"text": "hi"})[0] == 503
    s.wait_ready()
    assert s.get("/health_generate")[0] == 200
    assert s.get("/ready")[0] == 200
    start.knobs.write_text(json.dumps({"health_fail": True}))  # flipped at run time
    assert s.get("/ready")[0] == 503
    assert s.get("/health")[0] == 503 and s.get("/health_generate")[0] == 503
    start.knobs.unlink()  # no file, no faults
    # UnHealthy until a health check generates (0.5.23 http_server.py: only health_generate sets Up again).
    assert s.get("/ready")[0] == 503
    assert s.get("/health")[0] == 200 and s.get("/ready")[0] == 200


def test_exit_after_knob(start, models):
    s = start(dflash_args(models), exit_after_s=0.3)
    assert s.proc.wait(timeout=5) != 0


QWEN = speed_model.target(QWEN_CONFIG)  # the lab hub's Qwen3.6: 3 linear-attention layers in 4
KIMI = speed_model.target(KIMI_CONFIG)
NVLINK, PCIE, HOST = (speed_model.Link("nvlink", 400.0), speed_model.Link("pcie", 41.3), speed_model.Link("host", 27.17))


def test_speed_model_accepts_more_with_longer_drafts_with_diminishing_returns():
    chain = [speed_model.accept_length(QWEN, "DFLASH", n, None) for n in (4, 8, 12, 16)]
    gains = [b - a for a, b in itertools.pairwise(chain)]
    assert chain == sorted(chain) and gains == sorted(gains, reverse=True) and gains[-1] > 0
    assert speed_model.accept_length(QWEN, None, 16, None) == 1.0
    # DDTree's spine (budget <= draft tokens - 1) verifies the chain DFlash verifies: the same accept length.
    assert [speed_model.accept_length(QWEN, "DDTREE", 16, b) for b in (3, 7, 11, 15)] == chain
    assert speed_model.accept_length(KIMI, "DFLASH", 8, None) == 3.45  # the lab's deployed Kimi figure


def test_speed_model_tree_gains_on_a_dense_target_and_loses_on_a_hybrid_one():
    assert QWEN.recurrent_share == 0.75 and KIMI.recurrent_share == 0.0
    dense = speed_model.target({**QWEN_CONFIG, "layer_types": ["full_attention"] * 4})
    budgets = (15, 31, 63, 127)
    on_dense = [speed_model.accept_length(dense, "DDTREE", 16, b) for b in budgets]
    on_hybrid = [speed_model.accept_length(QWEN, "DDTREE", 16, b) for b in budgets]
    per_node = [(b - a) / (y - x) for (a, x), (b, y) in itertools.pairwise(zip(on_dense, budgets))]
    assert on_dense == sorted(on_dense) and per_node == sorted(per_node, reverse=True) and per_node[-1] > 0
    assert on_hybrid == sorted(on_hybrid, reverse=True) and on_hybrid[1] < on_hybrid[0]  # beyond the spine: less


def test_speed_model_verifying_more_costs_more_and_the_all_reduce_costs_most_over_host_memory():
    def step(tp, link, slots, batch=1):
        return speed_model.Pace(QWEN, tp, link, slots, True).step_seconds(batch)

    assert step(1, None, 4) < step(1, None, 8) < step(1, None, 16) < step(1, None, 128)
    assert speed_model.Pace(QWEN, 1, HOST, 16, True).allreduce_seconds(8) == 0.0  # TP 1: no all-reduce
    costs = [speed_model.Pace(QWEN, 8, link, 16, True).allreduce_seconds(8) for link in (NVLINK, PCIE, HOST)]
    assert costs == sorted(costs) and costs[2] > 10 * costs[0]
    # Over host memory TP 2 does not pay for itself at eight requests: one GPU a replica serves more.
    one_gpu = 8 / step(1, None, 16)  # eight replicas, one request each
    two_gpus = 4 * 2 / step(2, HOST, 16, batch=2)
    assert one_gpu > two_gpus and 4 * 2 / step(2, NVLINK, 16, batch=2) > one_gpu


def test_speed_model_reads_the_link_nccl_takes_from_the_gpu_profile_and_the_environment():
    ring = runpy.run_path(str(TORCH_STANDIN / "torch" / "_gpus.py"))["ring"]  # what NCCL makes of the GPUs
    nvlink = speed_model.link(ring(8, env={}))  # the autouse profile: 8 B200s, NV18 between each pair
    host = speed_model.link(ring(8, env={"NCCL_P2P_DISABLE": "1"}))
    assert nvlink.transport == "nvlink" and host == speed_model.Link("host", 27.17)  # the real P2P-off capture
    assert nvlink.busbw_gbps > 10 * host.busbw_gbps


def test_speed_model_speculation_gains_less_as_the_batch_grows():
    def speedup(batch):
        drafted = speed_model.Pace(KIMI, 8, PCIE, speed_model.width("DFLASH", 8, None), True)
        plain = speed_model.Pace(KIMI, 8, PCIE, 1, False)
        return 3.45 * plain.step_seconds(batch) / drafted.step_seconds(batch)

    assert speedup(1) > speedup(8) > speedup(64)
    assert [speed_model.tokens_after(k, 3.45) for k in (1, 2, 3)] == [3, 6, 10]
    # The deployed Kimi (DFlash block 8 at TP 8 on the PCIe box, P2P over PCIe): 3.45 tokens a 25 ms step.
    kimi = speed_model.Pace(KIMI, 8, PCIE, 8, True)
    assert kimi.step_seconds(1) == pytest.approx(0.025, abs=1e-4)
    assert speed_model.width("DDTREE", 16, 15) == 16 and speed_model.width(None, 8, None) == 1


def _best_at_one_request(model, algorithm, tried):
    """The algorithm's best speedup over autoregressive decoding at one request on one GPU, and its settings:
    `tried` (draft tokens, steps) pairs."""
    plain = speed_model.Pace(model, 1, None, 1, False).step_seconds(1)

    def speedup(n, steps):
        pace, accept = speed_model.server(model, algorithm, n, None, 1, None, steps, 1 if steps else None)
        return accept * plain / pace.step_seconds(1)
    return max((speedup(n, steps), (n, steps)) for n, steps in tried)


def test_speed_model_per_algorithm_lands_between_the_published_gaps_at_one_request():
    dflash, _ = _best_at_one_request(QWEN, "DFLASH", [(n, None) for n in range(2, 17)])
    mtp, (_, mtp_steps) = _best_at_one_request(QWEN, "EAGLE", [(s + 1, s) for s in range(1, 16)])
    eagle3, _ = _best_at_one_request(QWEN, "EAGLE3", [(s + 1, s) for s in range(1, 16)])
    ngram, _ = _best_at_one_request(QWEN, "NGRAM", [(n, None) for n in range(2, 17)])
    print(f"best over AR at one request: DFlash {dflash:.2f}x, MTP {mtp:.2f}x ({mtp_steps} steps), "
          f"EAGLE-3 {eagle3:.2f}x, NGRAM {ngram:.2f}x")
    assert 1.5 <= dflash / mtp <= 2.1  # LMSYS on Qwen3.5-397B: 1.5x; z-lab's Qwen3.5-4B card: 2.1x
    assert 6 <= mtp_steps <= 8  # about the 7 steps LMSYS chose for MTP
    assert 2.0 <= dflash / eagle3 <= 2.5 and 2.2 <= eagle3 <= 2.8  # the DFlash paper; SGLang's docs' 2.4x
    assert 1.2 <= ngram < eagle3 < mtp < dflash
    # NEXTN is SGLang's alias of EAGLE: the same drafter, the same figures.
    assert speed_model.accept_length(QWEN, "NEXTN", 4, None, 3, 1) == speed_model.accept_length(QWEN, "EAGLE", 4, None, 3, 1)


def test_speed_model_drafters_of_a_token_a_pass_pay_a_pass_a_step_and_accept_less_deeper():
    # Four one-layer passes cost more than DFlash's one block pass (the DFlash authors' comparison).
    assert speed_model.draft_overhead("EAGLE3", 5, 4) > speed_model.draft_overhead("DFLASH", 16)
    assert speed_model.draft_overhead("NGRAM", 8) < speed_model.draft_overhead("EAGLE", 2, 1)
    assert speed_model.draft_overhead(None, None) == 0.0
    steps = [speed_model.accept_length(QWEN, "EAGLE", s + 1, None, s, 1) for s in range(1, 9)]
    gains = [b - a for a, b in itertools.pairwise(steps)]
    assert steps == sorted(steps) and gains == sorted(gains, reverse=True) and gains[-1] > 0
    # A chain is its steps long, whatever draft tokens a tree (topk > 1) verifies; a tree gains on a dense
    # target and loses on the hybrid one, as DDTree's does.
    dense = speed_model.target({**QWEN_CONFIG, "layer_types": ["full_attention"] * 4})
    chain, tree = (speed_model.accept_length(dense, "EAGLE", n, None, 3, k) for n, k in ((4, 1), (8, 4)))
    assert tree > chain and speed_model.accept_length(QWEN, "EAGLE", 8, None, 3, 4) < \
        speed_model.accept_length(QWEN, "EAGLE", 4, None, 3, 1)
    assert speed_model.width("EAGLE", 8, None) == 8


def test_speed_model_ngram_loses_to_autoregressive_decoding_at_many_requests():
    plain = speed_model.Pace(QWEN, 1, None, 1, False)
    for n in (2, 4, 8):
        pace, accept = speed_model.server(QWEN, "NGRAM", n, None, 1, None)
        assert accept * plain.step_seconds(1) / pace.step_seconds(1) > 1.2
        assert accept * plain.step_seconds(64) / pace.step_seconds(64) < 1.0


def test_the_server_reports_its_link_and_paces_by_it(start, models):
    """NCCL_P2P_DISABLE=1 in the engine's environment: the all-reduce goes through host memory, slower."""
    steps = {}
    for env in ({}, {"NCCL_P2P_DISABLE": "1"}):
        s = start(dflash_args(models), env=env)
        s.wait_ready()
        model = json.loads(s.get("/server_info")[1])["lab_speed_model"]
        steps[model["link"]["transport"]] = model["step_s"]
        s.stop()
    assert set(steps) == {"nvlink", "host"} and steps["host"] > steps["nvlink"]


# --- processes, signals, health and load --------------------------------------------------
# What SGLang 0.5.23 does (paths inside its wheel): a main process (HTTP + TokenizerManager), one
# scheduler process per TP rank and a detokenizer, both with PR_SET_PDEATHSIG=SIGKILL and no
# SIGTERM handler; a SubprocessWatchdog in the main process that kills the tree when a child died.


def stream_chat(port: int, body: dict, key: str | None = None) -> list[dict]:
    """The server-sent events of a streamed chat completion, [DONE] left out."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    connection.request("POST", "/v1/chat/completions", json.dumps(body),
                       {"Authorization": f"Bearer {key}"} if key else {})
    response = connection.getresponse()
    assert response.status == 200 and response.getheader("Content-Type") == "text/event-stream"
    lines = response.read().decode().splitlines()
    connection.close()
    return [json.loads(line[6:]) for line in lines if line.startswith("data: {")]


def children(pid: int) -> dict[int, str]:
    """The live child processes of `pid` with their names (/proc/PID/comm)."""
    found = {}
    for entry in Path("/proc").iterdir():
        try:
            stat = (entry / "stat").read_text() if entry.name.isdigit() else ""
            fields = stat[stat.rindex(")") + 2:].split() if stat else []
            if fields and int(fields[1]) == pid and fields[0] != "Z":
                found[int(entry.name)] = (entry / "comm").read_text().strip()
        except (OSError, ValueError):
            continue
    return found


def wait_for(check, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.1)
    return False


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


def catches(pid: int, signum: int) -> bool:
    """Whether the process has a handler for `signum` (SigCgt in /proc/PID/status)."""
    status = Path(f"/proc/{pid}/status").read_text()
    mask = int(next(line.split()[1] for line in status.splitlines() if line.startswith("SigCgt:")), 16)
    return bool(mask >> (signum - 1) & 1)


def workers(s: "Standin") -> dict[int, str]:
    return {pid: name for pid, name in children(s.proc.pid).items() if name.startswith("sglang::")}


class InFlight(threading.Thread):
    """One /generate on its own thread: `status` and `words`, or the exception it ended with."""

    def __init__(self, s: "Standin", tokens: int, key: str | None = None, prompt: str = "in flight"):
        super().__init__(daemon=True)
        self.s, self.tokens, self.key, self.prompt = s, tokens, key, prompt
        self.status = self.words = self.error = None
        self.start()

    def run(self):
        try:
            request = urllib.request.Request(
                f"http://127.0.0.1:{self.s.port}/generate",
                json.dumps({"text": self.prompt, "sampling_params": {"max_new_tokens": self.tokens}}).encode())
            if self.key:
                request.add_header("Authorization", f"Bearer {self.key}")
            with urllib.request.urlopen(request, timeout=60) as response:
                self.status, self.words = response.status, len(json.loads(response.read())["text"].split())
        except Exception as error:
            self.error = error


class RawRequest:
    """A /generate sent on a socket of its own, so the test decides when the client leaves."""

    def __init__(self, port: int, tokens: int):
        body = json.dumps({"text": "raw", "sampling_params": {"max_new_tokens": tokens}}).encode()
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.sock.sendall(b"POST /generate HTTP/1.1\r\nHost: lab\r\nContent-Type: application/json\r\n"
                          + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)

    def close(self):
        self.sock.close()


def timed(call):
    started = time.monotonic()
    result = call()
    return result, time.monotonic() - started


@pytest.mark.parametrize("tp, schedulers", [(8, 8), (1, 1), (16, 8)])
def test_one_scheduler_per_tp_rank_and_a_detokenizer_that_die_with_the_main_process(start, models, tp, schedulers):
    s = start(dflash_args(models, "--tp-size", str(tp)))
    s.wait_ready()
    names = sorted(workers(s).values())
    # comm keeps 15 bytes of the titles sglang::scheduler_TP<n> and sglang::detokenizer
    assert names == ["sglang::detoken"] + ["sglang::schedul"] * schedulers
    assert catches(s.proc.pid, signal.SIGTERM)
    assert not any(catches(pid, signal.SIGTERM) for pid in workers(s))  # SIGTERM kills them outright
    pids = list(workers(s))
    s.proc.kill()  # the main process dies without a word: PR_SET_PDEATHSIG takes its children along
    s.proc.wait()
    assert wait_for(lambda: not any(alive(pid) for pid in pids), 5), [p for p in pids if alive(p)]


def test_a_scheduler_killed_by_sigterm_takes_the_server_down_with_its_requests(start, models):
    s = start(dflash_args(models))
    s.wait_ready()
    request = InFlight(s, 2000)  # ~10 s of decode steps (Kimi at TP 8 over the B200s' NVLink: 18 ms a step)
    time.sleep(0.5)
    scheduler = max(pid for pid, name in workers(s).items() if name == "sglang::schedul")
    os.kill(scheduler, signal.SIGTERM)
    assert s.proc.wait(timeout=5) == -signal.SIGKILL  # SIGQUIT from its watchdog: the tree, itself last
    request.join(5)
    assert request.status is None and isinstance(request.error, (ConnectionError, http.client.HTTPException))
    err = s.proc.stderr.read()
    assert f"(pid={scheduler}) crashed with exit code -15. Triggering SIGQUIT for cleanup..." in err


def test_sigterm_to_the_main_process_drains_then_exits_0(start, models):
    """Health answers 503 at once, requests (in flight and new) are still served, and once none is
    in flight the schedulers are told to shut down and the server exits 0."""
    s = start(dflash_args(models))
    s.wait_ready()
    request = InFlight(s, 1200)  # ~6 s: past the drain's first 5 s poll
    time.sleep(0.3)
    s.proc.send_signal(signal.SIGTERM)  # twice at once, as systemd and the unit's launcher both send it
    s.proc.send_signal(signal.SIGTERM)
    time.sleep(0.3)
    assert s.get("/health")[0] == 503 and s.get("/health_generate")[0] == 503 and s.get("/ready")[0] == 503
    assert s.get("/generate", {"text": "late"})[0] == 200  # not refused: the gateway must stop sending
    assert s.proc.poll() is None
    request.join(20)
    assert (request.status, request.words) == (200, 1200)
    pids = list(workers(s))
    assert s.proc.wait(timeout=15) == 0
    err = s.proc.stderr.read()
    assert "Gracefully exiting... Remaining number of requests 1." in err
    assert "Gracefully exiting... Remaining number of requests 0." in err
    assert "crashed" not in err  # the schedulers left on ShutdownReq, not killed
    assert not any(alive(pid) for pid in pids)


def test_sigterm_to_every_process_at_once_drops_the_requests_in_flight(start, models):
    """systemd's default KillMode=control-group: the schedulers die at once, so the main process's
    drain has nothing to drain with; its watchdog kills it within about a second."""
    s = start(dflash_args(models), new_session=True)
    s.wait_ready()
    streamed = []
    request = InFlight(s, 800)
    stream = threading.Thread(target=lambda: streamed.append(_stream_or_error(s.port)), daemon=True)
    stream.start()
    time.sleep(0.5)
    os.killpg(s.proc.pid, signal.SIGTERM)
    (code, seconds) = timed(lambda: s.proc.wait(timeout=5))
    assert code == -signal.SIGKILL and seconds < 2.5
    request.join(5)
    stream.join(5)
    assert request.status is None and isinstance(request.error, (ConnectionError, http.client.HTTPException))
    assert streamed and isinstance(streamed[0], Exception), streamed  # the stream breaks off mid-answer
    assert "SIGTERM received" in s.proc.stderr.read()


def _stream_or_error(port: int):
    try:
        return stream_chat(port, {"messages": [{"role": "user", "content": "long"}], "max_tokens": 800, "stream": True})
    except Exception as error:
        return error


def test_sigint_stops_accepting_finishes_requests_in_flight_and_dies_of_sigint(start, models):
    """uvicorn's SIGINT, which SGLang leaves in place."""
    s = start(dflash_args(models))
    s.wait_ready()
    request = InFlight(s, 300)  # ~1.5 s
    time.sleep(0.3)
    s.proc.send_signal(signal.SIGINT)
    time.sleep(0.8)
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", s.port), timeout=2)
    request.join(10)
    assert (request.status, request.words) == (200, 300)
    assert s.proc.wait(timeout=5) == -signal.SIGINT


def test_health_generates_one_token_in_a_second_and_waits_for_the_batch_in_progress(start, models):
    s = start(dflash_args(models))
    s.wait_ready()
    (code, _), seconds = timed(lambda: s.get("/health"))
    assert code == 200 and 1.0 <= seconds < 1.5  # polled every second
    # Every batch now takes 2.5 s (a long prefill chunk, a stalled GPU): a probe sent 1 s into a
    # batch is answered when that batch's output arrives, at its second poll.
    start.knobs.write_text(json.dumps({"batch_stall_s": 2.5}))
    time.sleep(0.6)  # the scheduler reads the knobs at most every 0.5 s
    request = InFlight(s, 40)
    time.sleep(1.0)
    (code, _), seconds = timed(lambda: s.get("/health"))
    assert code == 200 and 1.9 <= seconds < 2.6, seconds
    start.knobs.write_text("{}")
    request.join(30)
    assert request.status == 200


def test_a_health_probe_past_the_timeout_answers_503_and_a_sigterm_then_skips_the_drain(start, models):
    s = start(dflash_args(models), env={"SGLANG_HEALTH_CHECK_TIMEOUT": "2"})
    s.wait_ready()
    assert s.get("/ready")[0] == 200
    start.knobs.write_text(json.dumps({"batch_stall_s": 4}))
    time.sleep(0.6)
    raw = RawRequest(s.port, 500)
    time.sleep(0.3)
    (code, _), seconds = timed(lambda: s.get("/health"))
    assert code == 503 and 2.0 <= seconds < 3.0
    assert s.get("/ready")[0] == 503  # UnHealthy until a probe succeeds
    s.proc.send_signal(signal.SIGTERM)
    # No drain: the schedulers are stopped at the next check although a request is in flight;
    # that request is never answered, so the server waits for its client to leave.
    time.sleep(10)
    assert s.proc.poll() is None and not workers(s)  # its children are gone; it waits for the request
    raw.close()
    assert s.proc.wait(timeout=8) == 0
    err = s.proc.stderr.read()
    assert "Health check failed. Server couldn't get a response from detokenizer for last 2 seconds" in err
    assert "Signal SIGTERM received while health check failed. Force exiting." in err
    assert "Gracefully exiting" not in err


def test_health_without_generation_when_switched_off(start, models):
    s = start(dflash_args(models), env={"SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION": "0"})
    s.wait_ready()
    (code, _), seconds = timed(lambda: s.get("/health"))
    assert code == 200 and seconds < 0.5
    (code, _), seconds = timed(lambda: s.get("/health_generate"))  # always generates
    assert code == 200 and seconds >= 1.0


def gauge(metrics: str, name: str) -> float:
    return float(next(line.rsplit(" ", 1)[1] for line in metrics.splitlines() if line.startswith(name + "{")))


def test_loads_and_gauges_count_running_and_waiting_requests(start, models):
    s = start(dflash_args(models, "--enable-metrics", "--max-running-requests", "2", "--api-key", "k"))
    s.wait_ready()
    assert s.get("/v1/loads")[0] == 401  # behind the key, unlike /metrics
    requests = [InFlight(s, 600, key="k", prompt=f"request {n}") for n in range(4)]  # ~3 s each, 2 at a time
    time.sleep(1.8)
    answer = json.loads(s.get("/v1/loads?include=core,queues", key="k")[1])
    load = answer["loads"][0]
    assert (load["num_running_reqs"], load["num_waiting_reqs"], load["queues"]["waiting"]) == (2, 2, 2)
    assert load["max_running_requests"] == 2 and "memory" not in load and answer["accelerator"] == "NVIDIA B200"
    metrics = s.get("/metrics")[1]
    assert (gauge(metrics, "sglang:num_running_reqs"), gauge(metrics, "sglang:num_queue_reqs")) == (2.0, 2.0)
    assert 'sglang:http_requests_active{endpoint="/generate",method="POST"} 4.0' in metrics
    for request in requests:
        request.join(20)
    assert [r.status for r in requests] == [200] * 4
    time.sleep(0.3)
    load = json.loads(s.get("/v1/loads", key="k")[1])["loads"][0]
    assert (load["num_running_reqs"], load["num_waiting_reqs"]) == (0, 0) and "memory" in load
    metrics = s.get("/metrics")[1]
    assert (gauge(metrics, "sglang:num_running_reqs"), gauge(metrics, "sglang:num_queue_reqs")) == (0.0, 0.0)
    assert s.get("/v1/loads?include=bogus", key="k")[0] == 400
    prometheus = s.get("/v1/loads?format=prometheus", key="k")[1]
    assert 'sglang_num_running_reqs{dp_rank="0"} 0' in prometheus


# Run by the real SGLang 0.5.23's python: per (method, path, authorization, api_key, admin_api_key), whether
# its own middleware decision (utils/auth.py) lets the request through, at the auth level http_server.py
# gives the route; and every route it marks admin-optional.
_REAL_AUTH = r"""
import json, re, sys
from pathlib import Path
import sglang.srt.utils.auth as auth
source = (Path(auth.__file__).parent.parent / "entrypoints" / "http_server.py").read_text()
admin = set(re.findall(r'@app\.(?:api_route|post|get|put)\(\s*"([^"]+)"[^)]*\)\s*\n@auth_level\(AuthLevel\.ADMIN_OPTIONAL\)', source))
cases = json.loads(sys.argv[1])
print(json.dumps({"admin_optional": sorted(admin), "allowed": [auth.decide_request_auth(
    method=m, path=p, authorization_header=h, api_key=k, admin_api_key=a,
    auth_level=auth.AuthLevel.ADMIN_OPTIONAL if p in admin else auth.AuthLevel.NORMAL).allowed
    for m, p, h, k, a in cases]}))
"""


def test_the_stand_in_refuses_and_admits_each_route_and_key_as_sglangs_own_auth_decides(start, models):
    """Against the wheel's decide_request_auth: with an admin key, the client's API key gets 401 on the
    admin-optional routes (weights, internal state, adapters, the cache) and the admin key gets 401 on the
    others; with the API key alone, it opens both; health, readiness and metrics are open."""
    import ast
    from tests.sglang_real import real_sglang_python
    source = ast.parse((STANDIN_SRC / "sglang" / "launch_server.py").read_text())
    [declared] = [node.value for node in source.body if isinstance(node, ast.Assign)
                  and getattr(node.targets[0], "id", "") == "ADMIN_OPTIONAL"]
    admin_optional = ast.literal_eval(declared.args[0])  # frozenset({...})
    routes = [("GET", "/health"), ("GET", "/metrics"), ("GET", "/server_info"), ("POST", "/generate"),
              ("POST", "/flush_cache"), ("POST", "/update_weights_from_disk"), ("POST", "/set_internal_state"),
              ("POST", "/load_lora_adapter")]
    keys = {"both": ("client-key", "worker-admin-key"), "api key alone": ("client-key", None)}
    headers = [None, "Bearer client-key", "Bearer worker-admin-key", "bearer worker-admin-key", "Basic client-key"]
    cases = [(m, p, h, *pair) for pair in keys.values() for m, p in routes for h in headers]
    real = json.loads(subprocess.run([str(real_sglang_python()), "-c", _REAL_AUTH, json.dumps(cases)],
                                     capture_output=True, text=True, check=True).stdout.splitlines()[-1])
    assert admin_optional <= set(real["admin_optional"])
    seen = []
    for name, (api_key, admin_key) in keys.items():
        s = start(dflash_args(models, "--enable-metrics", "--api-key", api_key,
                              *(["--admin-api-key", admin_key] if admin_key else [])))
        s.wait_ready()
        for method, path in routes:
            for header in headers:
                request = urllib.request.Request(f"http://127.0.0.1:{s.port}{path}", method=method,
                                                 data=b"{}" if method == "POST" else None,
                                                 headers={"Authorization": header} if header else {})
                try:
                    with urllib.request.urlopen(request, timeout=10) as response:
                        status = response.status
                except urllib.error.HTTPError as error:
                    status = error.code
                seen.append(status != 401)
    assert seen == real["allowed"]
    both = dict(zip(cases, seen))
    for path in ("/update_weights_from_disk", "/set_internal_state"):
        assert not both[("POST", path, "Bearer client-key", "client-key", "worker-admin-key")]
        assert both[("POST", path, "Bearer worker-admin-key", "client-key", "worker-admin-key")]


def test_the_readiness_probe_sees_a_thinking_kimi_generate(start, models):
    """Kimi K2.6 served with its reasoning parser thinks by default: the probe's 32-token answer is all
    reasoning_content, its content "" (as the real parser splits it: tests/lab_code/test_sglang_conformance.py),
    and the probe counts it as generating, from the tokens and the reasoning."""
    import getpass

    from operations.server import readiness
    from tests.unit.test_host_scripts import load

    s = start(dflash_args(models, "--reasoning-parser", "kimi_k2", "--served-model-name", "kimi-k2.6"))
    s.wait_ready()
    ask = {"model": "kimi-k2.6", "max_tokens": 32, "messages": [{"role": "user", "content": "hi"}]}
    message = json.loads(s.get("/v1/chat/completions", ask)[1])["choices"][0]["message"]
    assert message["content"] == "" and len(message["reasoning_content"].split()) == 32
    probe = load("probe_server").probe(str(s.port), "kimi-k2.6", "/nonexistent", getpass.getuser())
    assert readiness.generates(probe), probe
    assert probe["completion"] and probe["algorithm"] == "DFLASH"
