"""The KV-cache planner (deployment/server/capacity.py): the bytes a token takes, from the models' real
config.json (tests/fixtures/model_configs), equal to what SGLang 0.5.23's own memory-pool code computes for the
same config (tests/sglang_kv_cell.py in the real-SGLang env: ModelConfig, then
srt/model_executor/pool_configurator.py DefaultPoolConfigurator._compute_cell_size for the target,
srt/speculative/dflash_utils.py dflash_draft_cell_size_per_token for a DFlash drafter, and
srt/configs/mamba_utils.py mamba_cache_per_req for a hybrid model's recurrent state); and what it refuses."""

import doctest
import json
from pathlib import Path

import pytest

from deployment.knobs import BadHostData
from deployment.server import capacity, resident
from deployment.server.capacity import GIB, NoRule, kv_geometry, plan_replica, refusal
from tests.sglang_real import run_with_real_sglang

CONFIGS = Path(__file__).resolve().parents[1] / "fixtures" / "model_configs"
REAL_SCRIPT = Path(__file__).resolve().parents[1] / "sglang_kv_cell.py"


def config(name: str) -> dict:
    return json.loads((CONFIGS / f"{name}.json").read_text())


def drafter_config() -> dict:
    """A DFlash drafter's shape: Qwen3-4B's decoder layers as z-lab's DFlashDraftModel names them, 5 of them."""
    return {**config("Qwen3-4B"), "architectures": ["DFlashDraftModel"], "num_hidden_layers": 5}


# (name, config, TP size, --kv-cache-dtype, drafter?)
CASES = [
    ("Kimi-K2.6", config("Kimi-K2.6"), 8, "auto", False),  # MLA: the same latent on every rank
    ("Kimi-K2.6", config("Kimi-K2.6"), 8, "fp8_e4m3", False),
    ("Kimi-K2.6", config("Kimi-K2.6"), 16, "auto", False),
    ("Qwen3.6-27B", config("Qwen3.6-27B"), 1, "auto", False),  # hybrid: 16 of 64 layers hold KV
    ("Qwen3.6-27B", config("Qwen3.6-27B"), 2, "auto", False),
    ("Qwen3.6-27B", config("Qwen3.6-27B"), 4, "fp8_e5m2", False),
    ("Qwen3-4B", config("Qwen3-4B"), 1, "auto", False),  # GQA: 8 KV heads
    ("Qwen3-4B", config("Qwen3-4B"), 2, "auto", False),
    ("Qwen3-4B", config("Qwen3-4B"), 16, "fp8_e4m3", False),  # TP above the KV heads: one head a rank
    ("drafter", drafter_config(), 1, "auto", True),
    ("drafter", drafter_config(), 8, "auto", True),
]
IDS = [f"{name}-tp{tp}-{dtype}" for name, _, tp, dtype, _ in CASES]


@pytest.fixture(scope="module")
def sglang_figures(tmp_path_factory):
    """SGLang's own figures for every case, in one run of the real env (~30 s: torch's import)."""
    payload = []
    for i, (_, cfg, tp, dtype, draft) in enumerate(CASES):
        path = tmp_path_factory.mktemp(f"model{i}")
        (path / "config.json").write_text(json.dumps(cfg))
        payload.append({"path": str(path), "tp": tp, "kv_cache_dtype": dtype, "draft": draft})
    return run_with_real_sglang(REAL_SCRIPT, {"cases": payload})["cases"]


@pytest.mark.parametrize("index", range(len(CASES)), ids=IDS)
def test_bytes_per_token_are_what_sglangs_memory_pool_computes(sglang_figures, index):
    _, cfg, tp, dtype, _ = CASES[index]
    real = sglang_figures[index]
    assert "error" not in real, real
    geometry = kv_geometry(cfg, tp_size=tp, kv_cache_dtype=dtype)
    assert geometry.bytes_per_token == real["cell_size"]
    assert geometry.state_bytes_per_request == real["state_bytes"]


def test_the_figures_of_the_shipped_models():
    # What the comparison above holds SGLang to, written out: Kimi K2.6 (512 + 64) x 61 layers x 2 bytes
    # on every rank; Qwen3.6-27B 4 KV heads x 2 x 256 x 16 full-attention layers x 2 bytes, and a 147 MiB
    # Gated DeltaNet state per request over its 48 linear-attention layers; Qwen3-4B 8 x 2 x 128 x 36 x 2.
    assert kv_geometry(config("Kimi-K2.6"), 8, "auto").bytes_per_token == 70272
    qwen = kv_geometry(config("Qwen3.6-27B"), 1, "auto")
    assert (qwen.bytes_per_token, qwen.state_bytes_per_request) == (65536, 153944064)
    assert kv_geometry(config("Qwen3-4B"), 1, "auto").bytes_per_token == 147456


def test_an_architecture_without_a_rule_is_said_so_in_one_line():
    cfg = {"architectures": ["GptOssForCausalLM"], "num_hidden_layers": 24}
    with pytest.raises(NoRule) as raised:
        kv_geometry(cfg, tp_size=1, kv_cache_dtype="auto")
    line = str(raised.value)
    assert "\n" not in line
    assert line.startswith("architecture GptOssForCausalLM: the KV-cache planner has no rule for it")
    assert "rather than guess" in line


def test_an_unknown_kv_cache_dtype_is_refused_not_guessed():
    with pytest.raises(NoRule, match="--kv-cache-dtype fp4_e2m1"):
        kv_geometry(config("Qwen3-4B"), tp_size=1, kv_cache_dtype="fp4_e2m1")


def test_a_tp_size_that_splits_the_linear_attention_heads_unevenly_is_refused_not_guessed():
    # SGLang pads the key-head groups then (srt/configs/mamba_utils.py, extra_groups_for_head_shards).
    with pytest.raises(NoRule, match="^TP 32 does not divide the linear-attention heads"):
        kv_geometry(config("Qwen3.6-27B"), tp_size=32, kv_cache_dtype="auto")


def kimi_plan(card_bytes: int, **kw):
    return plan_replica("sglang@kimi_k26_dflash-gpu0-7", card_bytes=card_bytes, mem_fraction_static=0.9, tp_size=8,
                        target_weight_bytes=595 * 10**9, drafter_weight_bytes=0,
                        target=kv_geometry(config("Kimi-K2.6"), 8, "auto"), typical_request_tokens=8192, **kw)


def test_weights_that_fit_with_no_room_for_the_kv_cache_are_refused_in_one_line():
    card = 80 * GIB  # 72 GiB usable at 0.9: the 74.4 GB a GPU of Kimi's weights fit, its KV cache does not
    assert 595 * 10**9 / 8 < card * 0.9  # what the weights-only memory check passes
    plan = kimi_plan(card)
    assert 0 < plan.tokens < 262144
    line = refusal(plan, min_tokens=262144)
    assert line == (
        f"sglang@kimi_k26_dflash-gpu0-7: its KV cache holds {plan.tokens} tokens ({plan.pool_bytes / GIB:.1f} GiB a "
        f"GPU at 70272 bytes a token), fewer than min_kv_tokens 262144: run fewer replicas, a larger tp_size, an fp8 "
        f"KV cache (--kv-cache-dtype fp8_e4m3) or a shorter --context-length")
    assert refusal(kimi_plan(180 * GIB), min_tokens=262144) is None


def test_weights_above_the_budget_leave_no_tokens():
    assert kimi_plan(64 * GIB).tokens == 0


def test_the_budget_is_what_the_engine_reads_free_after_the_load_less_its_slack():
    """SGLang's budget (_profile_available_bytes): free after the load - free before it x (1 - mem_fraction_static);
    free before is CUDA's total (below nvidia-smi's) less what is resident then, free after also less the weights
    a rank loads."""
    plan = plan_replica("r", card_bytes=100 * GIB, mem_fraction_static=0.5, tp_size=2, target_weight_bytes=20 * GIB,
                        drafter_weight_bytes=4 * GIB, target=capacity.KVGeometry("gqa", 1000),
                        drafter=capacity.KVGeometry("gqa", 24), typical_request_tokens=1000)
    before = 100 * GIB - resident.cuda_unseen_bytes(100 * GIB) - resident.resident_before_load(2)
    after = before - 12 * GIB
    assert (plan.free_before_load_bytes, plan.free_after_load_bytes) == (before, after)
    assert plan.pool_bytes == int(after - before * 0.5)
    assert plan.bytes_per_token == 1024
    assert plan.tokens == plan.pool_bytes // 1024
    assert plan.state_bytes == 0 and plan.engine_refusal is None
    # No speculation, no --max-running-requests: 512 requests per context's worth of tokens, within 2048-4096.
    assert plan.max_running_requests == max(min(int(plan.tokens / 2048 * 512), 4096), 2048)
    assert plan.max_request_tokens == 2048 - 1  # the geometry's context (2048: no key named)
    assert plan.concurrent_requests == min(plan.tokens // 1000, plan.max_running_requests)


def test_what_cuda_does_not_show_is_the_measured_figure_on_the_measured_cards_and_their_line_between():
    mib = 1 << 20
    assert resident.cuda_unseen_bytes(81_559 * mib) == 480 * mib  # H100 80GB HBM3
    assert resident.cuda_unseen_bytes(143_771 * mib) == 615 * mib  # H200
    assert 480 * mib < resident.cuda_unseen_bytes(97_887 * mib) < 615 * mib  # RTX PRO 6000, between them


def test_what_is_resident_before_the_load_is_the_cuda_context_and_the_parallel_groups_buffers():
    mib = 1 << 20
    assert resident.resident_before_load(1) == 527 * mib
    assert resident.resident_before_load(4) == (527 + 24) * mib  # the custom all-reduce's buffers
    assert resident.resident_before_load(3) == 527 * mib  # no custom all-reduce at 3 ranks
    # TP 8: the public TP-8 log's 1.29 GB at distributed init, with the context within 0.05 GiB of what its card
    # did not show free before the load (1.85 GiB).
    assert resident.resident_before_load(8) == resident.resident_before_load(16) == 527 * mib + round(1.29 * GIB)
    assert abs(resident.resident_before_load(8) / GIB - 1.85) < 0.05
    # At mem_fraction_static 0.9 a TP-8 rank of 180 GB cards keeps 0.9 of what is resident and of what CUDA does
    # not show from its pool: ~2.3 GiB, where a 1 GiB reserve was once planned.
    kept = 0.9 * (resident.resident_before_load(8) + resident.cuda_unseen_bytes(183_359 * mib))
    assert 2.2 * GIB < kept < 2.4 * GIB


def qwen_plan(**kw):
    qwen = kv_geometry(config("Qwen3.6-27B"), 1, "auto")
    return qwen, plan_replica("sglang@qwen36_ddtree-gpu0", card_bytes=96 * GIB, mem_fraction_static=0.9, tp_size=1,
                              target_weight_bytes=54 * GIB, drafter_weight_bytes=0, target=qwen,
                              typical_request_tokens=4096, **kw)


def test_a_hybrid_models_state_slots_come_out_of_its_share_and_cap_the_running_requests():
    """Without speculation SGLang fits (share - one) // one slots, 3 a running request with no buffer, and takes
    only the slots it allocates (plus the padding slot) from the budget, not the whole 0.9/1.9 share."""
    qwen, plan = qwen_plan(mamba_strategy="no_buffer", overlap_schedule=False)
    per = qwen.state_bytes_per_request
    budget = plan.pool_bytes + plan.state_bytes
    slots = int((budget * 0.9 / 1.9 - per) // per)
    assert abs(plan.state_bytes - (slots + 1) * per) <= 1
    assert plan.state_bytes < budget * 0.9 / 1.9
    assert plan.tokens == plan.pool_bytes // 65536
    assert plan.max_running_requests == slots // 3
    assert plan.concurrent_requests == min(plan.tokens // 4096, slots // 3)


@pytest.mark.parametrize("strategy, overlap, radix, slots", [
    ("no_buffer", False, True, 3), ("extra_buffer_lazy", True, True, 4), ("extra_buffer", False, True, 4),
    ("extra_buffer", True, True, 5), ("extra_buffer", True, False, 1)])
def test_state_slots_a_request_takes_by_strategy(strategy, overlap, radix, slots):
    assert capacity.mamba_slots_per_request(strategy, overlap, radix) == slots


def test_auto_resolves_as_the_engine_does():
    assert capacity.resolved_mamba_strategy("auto", True, 1) == ("extra_buffer", True)
    assert capacity.resolved_mamba_strategy("auto", False, 64) == ("extra_buffer", False)
    assert capacity.resolved_mamba_strategy("auto", False, 1) == ("no_buffer", False)
    assert capacity.resolved_mamba_strategy("extra_buffer_lazy", False, 1) == ("extra_buffer_lazy", False)


def test_the_lazy_extra_buffer_without_overlap_is_refused_in_the_engines_words():
    _, plan = qwen_plan(mamba_strategy="extra_buffer_lazy", overlap_schedule=False, draft_tokens=16)
    assert (plan.tokens, plan.engine_refusal) == (0, "AssertionError: Lazy extra buffer requires overlap schedule "
                                                     "(--disable-overlap-schedule is incompatible)")
    assert refusal(plan, min_tokens=0).startswith("sglang@qwen36_ddtree-gpu0: SGLang 0.5.23 would stop sizing its "
                                                  "memory pool, after loading the weights: AssertionError: Lazy")


def test_speculation_reserves_intermediate_states_only_for_the_requests_that_can_run():
    """DFlash's 16 draft tokens: the slots are solved jointly with the intermediate states, and the intermediate
    states are taken for min(max_running_requests, slots / ratio) + 1 requests, not for every slot."""
    qwen, plain = qwen_plan(mamba_strategy="no_buffer", overlap_schedule=False)
    _, spec = qwen_plan(mamba_strategy="no_buffer", overlap_schedule=False, draft_tokens=16)
    per = qwen.state_bytes_per_request
    budget = spec.pool_bytes + spec.state_bytes
    slots = int((budget * 0.9 / 1.9 - per * 17) // (per * (1 + 16 / 3)))
    running = min(48, slots // 3)
    assert spec.max_running_requests == running < plain.max_running_requests
    assert abs(spec.state_bytes - ((slots + 1) * per + (running + 1) * per * 16)) <= 1
    _, capped = qwen_plan(mamba_strategy="no_buffer", overlap_schedule=False, draft_tokens=16, max_running_requests=2)
    assert capped.max_running_requests == 2 and capped.tokens > spec.tokens  # fewer intermediate states taken


def test_a_multimodal_class_reserves_100_mib_of_its_budget():
    text = {**config("Qwen3-4B"), "architectures": ["Qwen3ForCausalLM"]}
    plain = kv_geometry(text, 1, "auto")
    multimodal = capacity.replace(plain, multimodal=True)
    assert kv_geometry(config("Kimi-K2.6"), 8, "auto").multimodal and not plain.multimodal
    kw = dict(card_bytes=80 * GIB, mem_fraction_static=0.9, tp_size=1, target_weight_bytes=8 * GIB,
              drafter_weight_bytes=0)
    assert plan_replica("r", target=plain, **kw).pool_bytes - plan_replica("r", target=multimodal, **kw).pool_bytes \
        in (100 << 20, (100 << 20) + 1)


def test_the_context_length_is_read_as_get_context_length_reads_it():
    assert capacity.context_length({"max_position_embeddings": 4096, "seq_length": 8192}) == 8192  # keys in order
    assert capacity.context_length({"max_position_embeddings": 4096, "rope_scaling": {"factor": 4.0}}) == 16384
    # YaRN with an original length, and llama3's, are not multiplied
    yarn = {"factor": 64.0, "original_max_position_embeddings": 4096}
    assert capacity.context_length({"max_position_embeddings": 262144, "rope_scaling": yarn}) == 262144
    assert capacity.context_length({"max_position_embeddings": 8192,
                                    "rope_scaling": {"factor": 8.0, "rope_type": "llama3"}}) == 8192
    assert capacity.context_length({}) == 2048


def test_an_fa4_drafter_keeps_its_kv_in_the_models_dtype_under_an_fp8_target_cache():
    assert capacity.draft_kv_cache_dtype("fp8_e4m3", "fa4") == "auto"
    assert capacity.draft_kv_cache_dtype("fp8_e4m3", "flashinfer") == "fp8_e4m3"
    assert capacity.draft_kv_cache_dtype("auto", "fa4") == "auto"
    assert capacity.draft_kv_cache_dtype("auto", "fa4", "fp8_e5m2") == "auto"  # the drafter's own flag, still fa4
    kimi = config("Kimi-K2.6")
    args = ["--tp-size", "8", "--kv-cache-dtype", "fp8_e4m3", "--speculative-num-draft-tokens", "8"]
    plan = lambda backend: capacity.plan_server(  # noqa: E731
        "r", [*args, "--speculative-draft-attention-backend", backend], card_bytes=180 * GIB, target_config=kimi,
        target_weight_bytes=595 * 10**9, drafter_config=drafter_config(), drafter_weight_bytes=6 * 10**9)
    fp8_target = kv_geometry(kimi, 8, "fp8_e4m3").bytes_per_token
    assert plan("fa4").bytes_per_token == fp8_target + kv_geometry(drafter_config(), 8, "auto").bytes_per_token
    fp8_drafter = kv_geometry(drafter_config(), 8, "fp8_e4m3").bytes_per_token
    assert plan("flashinfer").bytes_per_token == fp8_target + fp8_drafter


def test_an_fp8_kv_cache_holds_twice_the_tokens():
    bf16 = kv_geometry(config("Kimi-K2.6"), 8, "auto").bytes_per_token
    assert kv_geometry(config("Kimi-K2.6"), 8, "fp8_e4m3").bytes_per_token * 2 == bf16


def test_the_docstring_example_holds():
    assert doctest.testmod(capacity).failed == 0


def snapshots(target_gb: float, drafter_gb: float = 0) -> dict:
    """What the hub says of Kimi K2.6 and its drafter: their config.json and weights of these sizes."""
    from operations.weights.hub import RepoFile, RepoSnapshot
    weights = lambda gb: (RepoFile("model.safetensors", int(gb * 1e9), "0" * 64, None),)  # noqa: E731
    found = {"target": RepoSnapshot("moonshotai/Kimi-K2.6", "a" * 40, weights(target_gb), config("Kimi-K2.6"))}
    if drafter_gb:
        found["drafter"] = RepoSnapshot("z-lab/Kimi-K2.6-DFlash", "b" * 40, weights(drafter_gb), drafter_config())
    return found


def kv_check(host_class: str, snapshots: dict, gpu_mib: int, **data) -> tuple[list[str], str]:
    """Preflight's KV check of the class's first Kimi replica on GPUs of `gpu_mib` each."""
    from pyinfra.context import ctx_host
    from deployment.hosts import resolve_worker
    from operations.server.checks import kv_capacity
    from tests.unit.fakehost import FakeHost
    from tests.unit.group_data import host_data
    worker, (d, *_) = resolve_worker(host_data(host_class, **data), host_class)
    gpus = [{"index": i, "memory_total_mib": gpu_mib} for i in range(8)]
    with ctx_host.use(FakeHost({})):
        return kv_capacity(d.replicas[0], worker.gpu.expected, snapshots, gpus, worker.min_kv_tokens)


def test_preflight_says_how_many_tokens_a_replica_holds_and_refuses_one_below_a_full_context():
    """Kimi K2.6 at TP 8 with its drafter: on B200 cards it holds a full context (262,144 tokens, its
    max_position_embeddings), and preflight's line says how many; on 96 GB cards its weights fit but a full
    context does not, refused in one line naming the default; that class serves a 192K context, which fits."""
    problems, said = kv_check("b200_nvlink", snapshots(595, 6), 183359)
    assert problems == [] and said.startswith("KV cache ") and " requests of 8,192 tokens" in said
    problems, said = kv_check("rtx_pro_6000_pcie", snapshots(595, 6), 97887)
    assert problems == [] and said.startswith("KV cache 204,")
    problems, _ = kv_check("rtx_pro_6000_pcie", snapshots(595, 6), 97887,
                           layouts={"kimi_k26_dflash": {"tp_size": 8}})
    (line,) = problems
    assert line.startswith("host-1: sglang@kimi_k26_dflash-gpu0-7: its KV cache holds ")
    assert "fewer than one full context (262144 tokens, the min_kv_tokens default)" in line


@pytest.mark.parametrize("host_class, profile, context", [("rtx_pro_6000_pcie", "kimi_k26_dflash", 196608),
                                                          ("rtx_pro_6000_pcie", "qwen36_ddtree", 163840),
                                                          ("b200_nvlink", "kimi_k26_dflash", None)])
def test_a_class_whose_kv_cache_holds_less_than_the_models_context_serves_the_context_its_layout_says(
        host_class, profile, context):
    """The layout's context_length is the server's --context-length, and a profile's own is then refused (argparse
    takes the last of two); a class that holds the model's context sets none."""
    from deployment.hosts import resolve
    from deployment.server.command_line import server_args, value
    from tests.unit.group_data import host_data
    server = resolve(host_data(host_class, profile=profile), host_class).replicas[0]
    assert server.engine.layout.context_length == context
    assert value(server_args(server), "--context-length") == (str(context) if context else None)
    if context:
        import copy
        profiles = copy.deepcopy(host_data(host_class).profiles)
        profiles[profile]["server_args"] += ["--context-len", "131072"]
        owned = rf"use layouts\['{profile}'\]\['context_length'\] for --context-length, which the deploy sets itself"
        with pytest.raises(BadHostData, match=rf"^profiles\['{profile}'\]\['server_args'\]=.*{owned}"):
            resolve(host_data(host_class, profile=profile, profiles=profiles), host_class)
        tuning = copy.deepcopy(host_data(host_class).sglang_tuning)
        tuning["extra_args"] += ["--context-length=131072"]
        with pytest.raises(BadHostData, match=rf"^sglang_tuning extra_args=.*{owned}"):
            resolve(host_data(host_class, profile=profile, sglang_tuning=tuning), host_class)


@pytest.mark.parametrize("bad", [0, "x", True, -1, 1.5])
def test_a_context_length_that_is_no_whole_number_is_refused_in_one_line(bad):
    from deployment.hosts import resolve
    from tests.unit.group_data import host_data
    with pytest.raises(BadHostData) as refused:
        resolve(host_data("b200_nvlink", layouts={"kimi_k26_dflash": {"tp_size": 8, "context_length": bad}}),
                "b200_nvlink")
    assert str(refused.value) == (f"group_data/b200_nvlink.py layouts['kimi_k26_dflash']['context_length']={bad!r} "
                                  "is not a whole number at least 1")


def test_a_context_above_the_models_own_is_refused_not_planned():
    """The profiles set SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN (for the drafter), with which SGLang would take a
    context past the target's max_position_embeddings: preflight refuses it, naming the model's."""
    problems, said = kv_check("b200_nvlink", snapshots(595, 6), 183359,
                              layouts={"kimi_k26_dflash": {"tp_size": 8, "context_length": 1966080}})
    assert problems == ["host-1: sglang@kimi_k26_dflash-gpu0-7: its --context-length 1966080 is above the model's "
                        "max_position_embeddings 262144: use at most 262144"]
    assert said == "KV cache not planned"


def test_min_kv_tokens_sets_the_floor_and_is_named_in_the_refusal():
    problems, _ = kv_check("b200_nvlink", snapshots(595, 6), 183359, min_kv_tokens=100000000)
    (line,) = problems
    assert "fewer than min_kv_tokens 100000000: run fewer replicas, a larger tp_size" in line
    problems, _ = kv_check("b200_nvlink", snapshots(595, 6), 183359, min_kv_tokens=65536)
    assert problems == []


def test_a_model_the_planner_cannot_size_is_said_so_and_not_refused():
    unknown = snapshots(595)
    unknown["target"] = type(unknown["target"])("x/y", "a" * 40, unknown["target"].files,
                                                {"architectures": ["MysteryForCausalLM"]})
    problems, said = kv_check("b200_nvlink", unknown, 183359)
    assert problems == [] and said.startswith("KV cache not planned (architecture MysteryForCausalLM:")


@pytest.mark.parametrize("spelled", [["--context-length", "131072"], ["--context-length=131072"]])
def test_a_shorter_context_in_the_profiles_flags_lowers_the_default_floor_however_it_is_spelled(spelled):
    """The default floor is one full context as SGLang reads it from the flags (argparse takes FLAG VALUE and
    FLAG=VALUE alike: command_line.value): Kimi on 96 GB cards, in a layout that sets no context of its own, holds
    131,072 tokens, not 262,144."""
    import copy
    from tests.unit.group_data import host_data
    profiles = copy.deepcopy(host_data("rtx_pro_6000_pcie").profiles)
    profiles["kimi_k26_dflash"]["server_args"] += spelled
    problems, _ = kv_check("rtx_pro_6000_pcie", snapshots(595, 6), 97887, profiles=profiles,
                           layouts={"kimi_k26_dflash": {"tp_size": 8}})
    assert problems == []


def test_a_max_total_tokens_in_the_profiles_flags_caps_the_plan_as_sglang_caps_its_pool():
    """--max-total-tokens is the profile's to set (it is no deploy flag), and SGLang holds no more than it:
    the plan, and so the floor, count what the engine will hold, in whole pages."""
    import copy
    from tests.unit.group_data import host_data
    profiles = copy.deepcopy(host_data("b200_nvlink").profiles)
    profiles["kimi_k26_dflash"]["server_args"] += ["--max-total-tokens", "100000"]
    problems, said = kv_check("b200_nvlink", snapshots(595, 6), 183359, profiles=profiles)
    assert said.startswith("KV cache 100,000 tokens")
    (line,) = problems  # one full context, 262,144 tokens, is the default floor
    assert "its KV cache holds 100000 tokens" in line
    paged = plan_replica("r", card_bytes=100 * GIB, mem_fraction_static=0.5, tp_size=1, target_weight_bytes=0,
                         drafter_weight_bytes=0, target=capacity.KVGeometry("gqa", 1000), page_size=64)
    assert paged.tokens == paged.pool_bytes // 1000 // 64 * 64 and paged.tokens % 64 == 0


def test_a_hostile_architecture_name_prints_escaped():
    """The hub's config.json names the architecture the planner says it cannot size: printed escaped, as every
    string from a hub is (basics/untrusted.py)."""
    hostile = snapshots(595)
    hostile["target"] = type(hostile["target"])("x/y", "a" * 40, hostile["target"].files,
                                                {"architectures": ["Evil\x1b[2JForCausalLM"]})
    _, said = kv_check("b200_nvlink", hostile, 183359)
    assert "\x1b" not in said and "Evil\\x1b[2JForCausalLM" in said


def test_a_flag_the_planner_reads_that_is_no_number_is_said_so_not_a_traceback():
    with pytest.raises(NoRule, match=r"^--page-size 'x': the KV-cache planner reads a number there$"):
        capacity.plan_server("r", ["--page-size", "x"], card_bytes=80 * GIB, target_config=config("Qwen3-4B"),
                             target_weight_bytes=8 * 10**9)


def test_a_draft_sized_as_the_targets_cells_adds_what_the_engine_adds_and_says_when_it_cannot_tell():
    """Qwen3.6-27B's MTP layer is named mtp_num_hidden_layers, which SGLang 0.5.23 does not read into the target's
    pool (spec_aux_hidden_state.py _resolve_eagle_aux_hidden_state reads num_nextn_predict_layers): the plan is the
    same tokens as without it, and the engine's own startup agrees (tests/unit/test_engine_startup.py, qwen36_mtp).
    A config that names num_nextn_predict_layers (DeepSeek's), or an EAGLE-3 drafter, the planner has no checked
    rule for: it says so rather than plan the drafter's own cells as DFlash's are planned."""
    args = ["--speculative-algorithm", "EAGLE", "--speculative-num-draft-tokens", "4"]
    qwen = config("Qwen3.6-27B")
    plan = lambda cfg, eagle, drafter=None: capacity.plan_server(  # noqa: E731
        "r", args, card_bytes=80 * GIB, target_config=cfg, target_weight_bytes=52 * 10**9, drafter_config=drafter,
        draft_kv_of_target=eagle)
    assert plan(qwen, True) == plan(qwen, False)
    deepseek_like = {**qwen, "text_config": {**qwen["text_config"], "num_nextn_predict_layers": 1}}
    with pytest.raises(NoRule, match=r"^num_nextn_predict_layers 1: the KV-cache planner has no rule for the KV a "
                                     r"draft through the target's own layers adds to its pool$"):
        plan(deepseek_like, True)
    with pytest.raises(NoRule, match=r"^a drafter whose KV SGLang sizes as the target's cell per draft layer "
                                     r"\(EAGLE-3\): the KV-cache planner has no rule checked against the engine"):
        plan(qwen, True, config("Qwen3-4B"))
