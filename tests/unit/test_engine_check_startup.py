"""The deploy's engine check runs the engine's startup arithmetic on the host's card and weights
(operations/server/flags.py RESOLVE with a sizing): the REAL SGLang 0.5.23 answers it with its own
scheduler code (ModelConfig, KVCacheConfigurator._resolve_memory_pool_config, resolve_max_num_reqs), and the
lab's stand-in, answering the same text, gives the same figures and the same refusals.

The real env has no GPU and lacks what DFlash's resolution imports (sgl_kernel), so the cases are Qwen3.6-27B
(its real config.json, tests/fixtures/model_configs, and sparse weight files of its size) without
speculation, on the RTX PRO 6000 class's GPU: the path of the hybrid model's state slots and the lazy extra
buffer's assertion, which is what a DDTree layout meets there too.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from pyinfra.context import ctx_host

from deployment.hosts import resolve
from operations.gpu.facts import NvidiaGpus
from operations.server import sandbox
from operations.server.flags import RESOLVE, SGLangRejects
from tests.gpu_standin_env import gpu_standin_env
from tests.sglang_real import resolve_many_with_real_sglang
from tests.unit.group_data import host_data
from tests.unit.resolution_cases import class_gpu

REPO = Path(__file__).resolve().parents[2]
STANDIN_PATH = os.pathsep.join(str(REPO / "lab" / p) for p in ("sglang_standin", "torch_standin"))
CLASS = "rtx_pro_6000_pcie"
LAZY = ["--mamba-radix-cache-strategy", "extra_buffer_lazy", "--disable-overlap-schedule"]
LAZY_ASSERTION = ("AssertionError: Lazy extra buffer requires overlap schedule "
                  "(--disable-overlap-schedule is incompatible)")
# A card of the class, 1 GiB of it resident before the load; no floor beyond one full context, or one no pool holds.
SIZING = {"card_mib": class_gpu(CLASS)["memory_mib"], "before_load_mib": class_gpu(CLASS)["memory_mib"] - 1024,
          "min_tokens": None}
OUT_OF_REACH = {**SIZING, "min_tokens": 10**12}
QWEN_WEIGHT_BYTES = 54 * 10**9


@pytest.fixture(scope="module")
def cases(tmp_path_factory) -> dict[str, dict]:
    qwen = tmp_path_factory.mktemp("Qwen3.6-27B")
    (qwen / "config.json").write_text((REPO / "tests" / "fixtures" / "model_configs" / "Qwen3.6-27B.json").read_text())
    with open(qwen / "model.safetensors", "wb") as weights:
        weights.truncate(QWEN_WEIGHT_BYTES)  # sparse: the size the check reads, no disk taken
    argv = ["--model-path", str(qwen), "--mem-fraction-static", "0.9"]
    return {name: {"argv": argv + extra, "env": {}, "gpu": class_gpu(CLASS), "sizing": sizing}
            for name, extra, sizing in (("sized", [], SIZING), ("lazy without overlap", LAZY, SIZING),
                                        ("below the floor", [], OUT_OF_REACH),
                                        ("auto without overlap", ["--disable-overlap-schedule"], SIZING))}


@pytest.fixture(scope="module")
def real(cases) -> dict[str, dict]:
    return dict(zip(cases, resolve_many_with_real_sglang(list(cases.values()))))


def standin(case: dict, tmp: Path) -> dict:
    """RESOLVE with the case's sizing, run by the stand-in under the GPU stand-in's nvidia-smi of the class."""
    env = {**os.environ, "PYTHONPATH": STANDIN_PATH, **gpu_standin_env(tmp, CLASS)}
    proc = subprocess.run([sys.executable, "-c", RESOLVE, json.dumps(case["argv"]), json.dumps(case["sizing"])],
                          env=env, capture_output=True, text=True, check=True)
    return json.loads(proc.stdout.split("@@RESOLVED@@")[1])


def test_the_real_engine_sizes_the_pool_and_caps_the_requests_and_the_stand_in_agrees(cases, real, tmp_path):
    theirs = real["sized"]
    assert "startup" in theirs, theirs
    figures = theirs["startup"]
    assert figures["max_total_num_tokens"] > figures["context_len"] == 262144
    assert figures["max_req_len"] == figures["context_len"] - 1
    # Its state slots cap the requests (22 here without speculation), far below the 2,048 the pool alone allows.
    assert 0 < figures["max_running_requests"] < 64
    assert standin(cases["sized"], tmp_path)["startup"] == figures


def test_the_lazy_extra_buffer_without_overlap_is_the_engines_assertion_on_both(cases, real, tmp_path):
    assert real["lazy without overlap"] == {"error": LAZY_ASSERTION}
    assert standin(cases["lazy without overlap"], tmp_path) == {"error": LAZY_ASSERTION}


def test_a_pool_below_the_floor_is_refused_in_the_engines_figures(cases, real, tmp_path):
    refused = real["below the floor"]["error"]
    tokens = real["sized"]["startup"]["max_total_num_tokens"]
    assert refused == (f"its startup sizes max_total_num_tokens={tokens} on {SIZING['card_mib']} MiB GPUs, "
                       f"fewer than min_kv_tokens {10**12}")
    assert standin(cases["below the floor"], tmp_path) == {"error": refused}


def test_the_fact_carries_the_sizing_to_the_host_and_its_refusal_back():
    command = SGLangRejects().command("/v", ("--model-path", "/m"), sizing=json.dumps(SIZING))
    assert json.dumps(SIZING) in command and command.count(RESOLVE[:40]) == 1
    assert SGLangRejects().process([f"@@RESOLVED@@{json.dumps({'error': LAZY_ASSERTION})}", "exit=0"]) == \
        LAZY_ASSERTION


def test_the_deploy_hands_the_check_the_replicas_smallest_card_and_the_floor():
    """The sizing (sandbox.startup_sizing) from the host's GPUs as nvidia-smi reads them: the smallest of the
    replica's own cards, what SGLang would find free on it before the load, the floor; none where the GPUs
    could not be read, or the replica's are not all there."""
    kimi = resolve(host_data("b200_nvlink"), "b200_nvlink").replicas[0]  # TP 8 over GPUs 0-7
    gpus = [{"index": i, "memory_total_mib": 183359 - (1000 if i == 5 else 0)} for i in range(8)]

    def sizing(read, min_kv_tokens=None):
        class Host:
            def get_fact(self, fact, **kwargs):
                assert fact is NvidiaGpus
                return read

        with ctx_host.use(Host()):
            return sandbox.startup_sizing(kimi, min_kv_tokens)

    handed = json.loads(sizing(gpus, 200_000))
    assert handed["card_mib"] == 182359 and handed["min_tokens"] == 200_000
    assert 179_000 < handed["before_load_mib"] < handed["card_mib"] - 2_000  # less what a TP-8 rank holds before its load
    assert json.loads(sizing(gpus))["min_tokens"] is None  # one full context, as the engine says it
    assert sizing({"unknown": "NVIDIA-SMI has failed"}) == "" and sizing(gpus[:4]) == ""


def test_the_radix_cache_strategy_auto_is_resolved_as_the_engine_resolves_it(cases, real, tmp_path):
    """No --mamba-radix-cache-strategy: SGLang picks the extra buffer under the overlap scheduler, else no
    buffer (arg_groups/overrides.py), and sizes the pool for it; the stand-in too."""
    for name, strategy in (("sized", "extra_buffer"), ("auto without overlap", "no_buffer")):
        theirs, mine = real[name], standin(cases[name], tmp_path)
        assert theirs["resolved"]["mamba_radix_cache_strategy"] == strategy, theirs.get("error")
        assert mine["resolved"]["mamba_radix_cache_strategy"] == strategy
        assert mine["resolved"]["disable_overlap_schedule"] == theirs["resolved"]["disable_overlap_schedule"]
        assert mine["startup"] == theirs["startup"]
