"""How many tokens one replica's KV cache holds, how many requests it runs at once and the longest request it
takes, as SGLang 0.5.23's startup sizes them: the pool from the card, what is resident before the weights load,
the weights, and the bytes a token takes there from the model's config.json.

Pure: plain values in, frozen plans out. Per GPU of a replica (SGLang sizes the pool per rank, every rank alike;
mem_cache/kv_cache_configurator.py, KVCacheConfigurator._profile_available_bytes):

    free before load = CUDA's total (cuda_unseen_bytes below nvidia-smi's) - what is resident (resident_before_load)
    free after load  = free before load - (target + drafter weights) / tp
    budget           = free after load - free before load x (1 - mem_fraction_static) - 100 MiB on a multimodal class
    tokens           = (budget - a hybrid model's state slots) // (target + drafter bytes per token)

then max_running_requests as resolve_max_num_reqs caps it and the longest request as tp_worker.py's max_req_len.
tests/unit/test_engine_startup.py holds every shipped layout's plan to the wheel's own code.

>>> kimi = {"architectures": ["KimiK25ForConditionalGeneration"],
...         "text_config": {"num_hidden_layers": 61, "kv_lora_rank": 512, "qk_rope_head_dim": 64,
...                         "torch_dtype": "bfloat16", "max_position_embeddings": 262144}}
>>> geometry = kv_geometry(kimi, tp_size=8, kv_cache_dtype="auto")
>>> geometry.bytes_per_token, geometry.context_length, geometry.multimodal
(70272, 262144, True)
>>> plan = plan_replica("sglang@kimi-gpu0-7", card_bytes=180 * GIB, mem_fraction_static=0.9, tp_size=8,
...                     target_weight_bytes=595 * 10**9, drafter_weight_bytes=0, target=geometry,
...                     typical_request_tokens=8192)
>>> plan.tokens, plan.max_running_requests, plan.max_request_tokens, plan.concurrent_requests
(1381189, 2697, 262143, 168)
"""

from dataclasses import dataclass, replace
from typing import Callable

from deployment.server.command_line import value
from deployment.server.resident import cuda_unseen_bytes, resident_before_load

MIB = 1 << 20
GIB = 1 << 30
# The prompt and output of a typical request, for the concurrent requests a plan states: a long chat turn
# or a coding agent's step (no profile names its own).
TYPICAL_REQUEST_TOKENS = 8192

# A multimodal model class reserves SGLANG_VLM_CACHE_SIZE_MB (100) of its budget for its embedding cache
# (environ.py; kv_cache_configurator.py mm_runtime_reservation_gb, which counts it as 100 / 1024 GiB), by its
# architecture (srt/configs/model_config.py multimodal_model_archs).
MULTIMODAL_RESERVE_BYTES = 100 * MIB
MULTIMODAL_ARCHITECTURES = frozenset({"KimiK25ForConditionalGeneration", "Qwen3_5ForConditionalGeneration",
                                      "Qwen3_5MoeForConditionalGeneration"})


# How far below its plan a running replica's own max_total_num_tokens (its /server_info) may fall before the
# plan counts as wrong. The plan follows the engine's arithmetic (the suite holds it to the wheel's code); what it
# cannot know is what a real host holds before the load beyond the CUDA context (resident.py: at TP 8 over PCIe and
# at TP 2-6 on NVLink the parallel groups are not measured). 10% of the smallest shipped pool (Kimi K2.6 at TP 8 on the RTX PRO 6000, ~14 GiB a GPU) is
# ~1.4 GiB a GPU more resident than planned.
ENGINE_TOLERANCE = 0.10
# A hybrid model's recurrent state gets mamba_full_memory_ratio of the KV cache's memory when the radix cache is
# on (--mamba-full-memory-ratio, 0.9 by default: srt/arg_groups/fields/schedule.py's fallback;
# kv_cache_configurator.py _handle_max_mamba_cache, mamba_budget).
MAMBA_FULL_MEMORY_RATIO = 0.9
# State slots a running request takes (kv_cache_configurator.py _calculate_mamba_ratio:
# MAMBA_CACHE_SIZE_MAX_RUNNING_REQUESTS_RATIO 3, plus allocation_sizing.py get_mamba_tracking_slots: one for the
# lazy extra buffer or the extra buffer without overlap, two for the extra buffer with overlap; 1 without the
# radix cache).
MAMBA_BASE_SLOTS = 3
# With speculation and no --max-running-requests, DFLASH resolves 48 (arg_groups/speculative_hook.py, _handle_dflash).
SPECULATIVE_MAX_RUNNING_REQUESTS = 48
# The config keys a context length is read from, in order (srt/utils/hf_transformers/common.py CONTEXT_LENGTH_KEYS).
CONTEXT_LENGTH_KEYS = (
    "max_sequence_length", "seq_length", "max_seq_len", "model_max_length", "max_position_embeddings")

# --kv-cache-dtype: bytes per element (0.5.23 srt/mem_cache/kv_cache_dtype.py, configure_kv_cache_dtype;
# "auto" is the model's dtype).
KV_DTYPE_BYTES = {"fp8_e4m3": 1, "fp8_e5m2": 1, "bf16": 2, "bfloat16": 2, "float16": 2, "fp16": 2}
MODEL_DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}


class NoRule(ValueError):
    """An architecture, a KV dtype or a TP split the planner has no rule for: it says so in one line rather
    than guess."""


@dataclass(frozen=True)
class KVGeometry:
    """What one token and one running request take on one GPU of a replica, and what else of the model's config
    its startup reads."""

    architecture: str
    bytes_per_token: int  # the KV cache, on one rank
    state_bytes_per_request: int = 0  # a hybrid model's recurrent (Mamba/GDN) state slot, on one rank
    context_length: int = 2048  # get_context_length's (its fallback where the config names none)
    multimodal: bool = False  # a multimodal model class: its budget reserves MULTIMODAL_RESERVE_BYTES


@dataclass(frozen=True)
class CapacityPlan:
    """One replica's KV pool, on each of its GPUs, and the limits the engine derives from it."""

    replica: str
    pool_bytes: int  # what the KV cache gets, per GPU
    bytes_per_token: int  # target's and drafter's KV together
    tokens: int  # what the replica holds (every rank holds the same tokens): max_total_num_tokens
    state_bytes: int  # the recurrent state slots and their speculative intermediates, per GPU (hybrid; else 0)
    concurrent_requests: int  # of request_tokens each, at most max_running_requests
    request_tokens: int  # a typical request's prompt and output
    max_running_requests: int = 0  # as resolve_max_num_reqs caps it
    max_request_tokens: int = 0  # the longest request, prompt and output: tp_worker.py's max_req_len
    free_before_load_bytes: int = 0  # what the engine will read as free before the load, per GPU
    free_after_load_bytes: int = 0  # and once the weights are in
    engine_refusal: str | None = None  # the engine's own words where its startup would stop, else None


def text_config(config: dict) -> dict:
    """The language model's part of a config.json: `text_config` where it is nested (Kimi K2.x, Qwen3.5/3.6)."""
    return config.get("text_config") or config


def _model_dtype_bytes(text: dict) -> int:
    # transformers 5 writes `dtype`, older configs `torch_dtype`; bfloat16 where neither is named.
    return MODEL_DTYPE_BYTES[text.get("dtype") or text.get("torch_dtype") or "bfloat16"]


def _dtype_bytes(kv_cache_dtype: str, text: dict) -> int:
    if kv_cache_dtype == "auto":
        return _model_dtype_bytes(text)
    if kv_cache_dtype not in KV_DTYPE_BYTES:
        known = ", ".join(sorted(KV_DTYPE_BYTES))
        raise NoRule(f"--kv-cache-dtype {kv_cache_dtype}: the KV-cache planner knows auto, {known}")
    return KV_DTYPE_BYTES[kv_cache_dtype]


def _mla(text: dict, tp_size: int, dtype_bytes: int) -> KVGeometry:
    # MLA keeps one latent (kv_lora_rank) and the rotary key (qk_rope_head_dim) per layer, the same on every
    # TP rank (0.5.23 srt/model_executor/pool_configurator.py, DefaultPoolConfigurator._compute_cell_size,
    # use_mla_backend branch; mem_cache/kv_cache_configurator.py, calculate_mla_kv_cache_dim).
    per_layer = text["kv_lora_rank"] + text["qk_rope_head_dim"]
    return KVGeometry("mla", per_layer * text["num_hidden_layers"] * dtype_bytes)


def _head_dim(text: dict) -> int:
    return text.get("head_dim") or text["hidden_size"] // text["num_attention_heads"]


def _kv_heads_per_rank(text: dict, tp_size: int) -> int:
    # KV heads split across TP ranks, one a rank when TP exceeds them (0.5.23 srt/configs/model_config.py,
    # ModelConfig.get_num_kv_heads: max(1, total // tp)). MHA configs name no KV heads: one per query head.
    return max(1, text.get("num_key_value_heads", text["num_attention_heads"]) // tp_size)


def _gqa_cell(text: dict, tp_size: int, dtype_bytes: int, layers: int) -> int:
    # K and V of head_dim each per KV head per layer (pool_configurator.py, _compute_cell_size, the
    # non-MLA branch: heads x (head_dim + v_head_dim) x layers x element size).
    return _kv_heads_per_rank(text, tp_size) * 2 * _head_dim(text) * layers * dtype_bytes


def _gqa(text: dict, tp_size: int, dtype_bytes: int) -> KVGeometry:
    return KVGeometry("gqa", _gqa_cell(text, tp_size, dtype_bytes, text["num_hidden_layers"]))


def _full_attention_layers(text: dict) -> int:
    if "layer_types" in text:
        return sum(kind == "full_attention" for kind in text["layer_types"])
    interval = text["full_attention_interval"]
    return sum((i + 1) % interval == 0 for i in range(text["num_hidden_layers"]))


def _hybrid_gdn(text: dict, tp_size: int, dtype_bytes: int) -> KVGeometry:
    # KV only on the full-attention layers (pool_configurator.py, DefaultPoolConfigurator.__init__: a
    # mambaish config's full_attention_layer_ids), plus per request one Gated DeltaNet state per
    # linear-attention layer: the conv state (q, k, v channels x (kernel - 1), in the model's dtype) and
    # the recurrent state (value heads x value dim x key dim, in mamba_ssm_dtype, float32 by default)
    # (srt/configs/qwen3_next.py mamba2_cache_params; srt/configs/mamba_utils.py Mamba2StateShape.create,
    # mamba_cache_per_req). Heads split across TP ranks.
    full = _full_attention_layers(text)
    linear = text["num_hidden_layers"] - full
    k_heads, v_heads = text["linear_num_key_heads"], text["linear_num_value_heads"]
    if k_heads % tp_size or v_heads % tp_size:
        raise NoRule(f"TP {tp_size} does not divide the linear-attention heads ({k_heads} key, {v_heads} value): "
                     f"the KV-cache planner has no rule for the uneven split")
    conv_channels = (v_heads * text["linear_value_head_dim"] + 2 * k_heads * text["linear_key_head_dim"]) // tp_size
    conv = conv_channels * (text["linear_conv_kernel_dim"] - 1) * _model_dtype_bytes(text)
    ssm = v_heads // tp_size * text["linear_value_head_dim"] * text["linear_key_head_dim"]
    ssm_bytes = ssm * MODEL_DTYPE_BYTES[text.get("mamba_ssm_dtype", "float32")]
    return KVGeometry("hybrid-gdn", _gqa_cell(text, tp_size, dtype_bytes, full), (conv + ssm_bytes) * linear)


# One rule per architecture, by config.json's `architectures[0]`: adding a model family is adding an entry.
RULES: dict[str, Callable[[dict, int, int], KVGeometry]] = {
    "DeepseekV3ForCausalLM": _mla,
    "DeepseekV2ForCausalLM": _mla,
    "KimiK25ForConditionalGeneration": _mla,  # Kimi K2.5/K2.6: a DeepSeek-V3 text_config
    "Qwen3ForCausalLM": _gqa,
    "Qwen3MoeForCausalLM": _gqa,
    "Qwen2ForCausalLM": _gqa,
    "LlamaForCausalLM": _gqa,
    "MistralForCausalLM": _gqa,
    # z-lab's DFlash drafters: Qwen3 decoder layers with per-head K and V, the same sizing (0.5.23
    # srt/speculative/dflash_utils.py, dflash_draft_cell_size_per_token).
    "DFlashDraftModel": _gqa,
    "Qwen3_5ForConditionalGeneration": _hybrid_gdn,  # Qwen3.5/3.6 dense
    "Qwen3_5ForCausalLM": _hybrid_gdn,  # its language model alone (a text-only checkpoint)
    "Qwen3_5MoeForConditionalGeneration": _hybrid_gdn,
    "Qwen3NextForCausalLM": _hybrid_gdn,
}


def context_length(text: dict) -> int:
    """The model's context as SGLang reads it (srt/utils/hf_transformers/common.py get_context_length): the first
    of CONTEXT_LENGTH_KEYS the language model's config names, times its rope scaling factor unless the scaling
    keeps an original_max_position_embeddings or is llama3's; 2048 where it names none."""
    scaling = text.get("rope_scaling") or {}
    factor = 1 if "original_max_position_embeddings" in scaling or scaling.get("rope_type") == "llama3" \
        else scaling.get("factor", 1)
    found = next((text[key] for key in CONTEXT_LENGTH_KEYS if text.get(key) is not None), None)
    return 2048 if found is None else int(factor * found)


def kv_geometry(config: dict, tp_size: int, kv_cache_dtype: str) -> KVGeometry:
    """What a token and a request take on one of `tp_size` ranks, from a model's config.json (a dict);
    NoRule (one line) for an architecture without a rule."""
    architectures = config.get("architectures") or text_config(config).get("architectures") or ["(none named)"]
    rule = RULES.get(architectures[0])
    if rule is None:
        raise NoRule(
            f"architecture {architectures[0]}: the KV-cache planner has no rule for it "
            f"(it knows {', '.join(sorted(RULES))}), so it plans no tokens rather than guess")
    text = text_config(config)
    try:
        geometry = rule(text, tp_size, _dtype_bytes(kv_cache_dtype, text))
        return replace(geometry, context_length=context_length(text),
                       multimodal=architectures[0] in MULTIMODAL_ARCHITECTURES)
    except (KeyError, TypeError, ZeroDivisionError) as error:  # a config of that architecture, malformed
        raise NoRule(f"architecture {architectures[0]}: its config.json lacks or mistypes {error}, which its "
                     "rule reads") from None


def check_draft_kv_of_target(config: dict, drafter_config: dict | None) -> None:
    """That a draft whose KV SGLang 0.5.23 sizes as the target's cell per draft layer (the EAGLE family) adds
    nothing the planner misses: the engine adds the target's cell times eagle_draft_num_layers over its KV
    layers (model_executor/pool_configurator.py, DefaultPoolConfigurator.__init__), which a draft without a
    path (MTP) takes from the TARGET's num_nextn_predict_layers (model_runner_components/spec_aux_hidden_state.py
    _resolve_eagle_aux_hidden_state). Qwen3.5/3.6's config names its MTP layers mtp_num_hidden_layers instead:
    none is added, and the draft worker's one layer is allocated after the pool is sized, out of the
    1 - mem_fraction_static slack. NoRule for a config that names num_nextn_predict_layers (DeepSeek's, GLM's)
    and for a drafter repo (EAGLE-3): the planner has no rule checked against the engine for them."""
    if drafter_config is not None:
        raise NoRule("a drafter whose KV SGLang sizes as the target's cell per draft layer (EAGLE-3): the KV-cache "
                     "planner has no rule checked against the engine for it")
    layers = text_config(config).get("num_nextn_predict_layers")
    if layers:
        raise NoRule(f"num_nextn_predict_layers {layers}: the KV-cache planner has no rule for the KV a draft "
                     "through the target's own layers adds to its pool")


def draft_kv_cache_dtype(kv_cache_dtype: str, draft_attention_backend: str | None,
                         draft_kv_cache_dtype_flag: str | None = None) -> str:
    """The KV dtype of a DFlash drafter's cache (mem_cache/kv_cache_dtype.py configure_kv_cache_dtype, as
    draft_kv_budget.py resolves it for the target's pool): --speculative-draft-kv-cache-dtype where given, else
    the target's; an fa4 draft backend cannot read a quantized KV cache, so it keeps the model's dtype then."""
    dtype = draft_kv_cache_dtype_flag or kv_cache_dtype
    if draft_attention_backend == "fa4" and dtype not in ("auto", "bf16", "bfloat16", "float16", "fp16"):
        return "auto"
    return dtype


def mamba_slots_per_request(strategy: str, overlap_schedule: bool, radix_cache: bool) -> int:
    """State slots a running request takes (kv_cache_configurator.py _calculate_mamba_ratio); ValueError with the
    engine's own assertion for the lazy extra buffer without the overlap schedule."""
    if not radix_cache:
        return 1
    if strategy == "extra_buffer_lazy" and not overlap_schedule:
        raise ValueError("Lazy extra buffer requires overlap schedule (--disable-overlap-schedule is incompatible)")
    if strategy == "extra_buffer_lazy":
        return MAMBA_BASE_SLOTS + 1
    if strategy == "extra_buffer":
        return MAMBA_BASE_SLOTS + (2 if overlap_schedule else 1)
    return MAMBA_BASE_SLOTS


def resolved_mamba_strategy(strategy: str, overlap_schedule: bool, page_size: int) -> tuple[str, bool]:
    """--mamba-radix-cache-strategy and whether the overlap schedule runs, as resolution leaves them for a hybrid
    model with the radix cache (arg_groups/overrides.py: `auto` is the extra buffer where the overlap schedule
    or pages above one want it, else no buffer, which turns the overlap schedule off)."""
    if strategy != "auto":
        return strategy, overlap_schedule
    if overlap_schedule or page_size > 1:
        return "extra_buffer", overlap_schedule
    return "no_buffer", False


def plan_replica(replica: str, *, card_bytes: int, mem_fraction_static: float, tp_size: int,
                 target_weight_bytes: int, drafter_weight_bytes: int, target: KVGeometry,
                 drafter: KVGeometry | None = None, typical_request_tokens: int = TYPICAL_REQUEST_TOKENS,
                 draft_tokens: int = 0, max_total_tokens: int | None = None, page_size: int = 1,
                 context_length: int | None = None, max_running_requests: int | None = None,
                 mamba_strategy: str = "auto", overlap_schedule: bool = True, radix_cache: bool = True,
                 mamba_full_memory_ratio: float = MAMBA_FULL_MEMORY_RATIO) -> CapacityPlan:
    """One replica's plan as SGLang's startup computes it (module docstring), from the card's memory as nvidia-smi
    reports it (`card_bytes`) and the server's settings: its KV pool per GPU, the tokens it holds
    (max_total_num_tokens: at most `max_total_tokens`, whole pages of `page_size`), the requests it runs at once
    (`max_running_requests` as given, 48 under speculation, capped by the pool and a hybrid model's state slots),
    the longest request (`context_length`, else the model's, and the pool) and the concurrent requests of
    `typical_request_tokens` those serve. Weights split evenly across the TP ranks. Where the engine's startup
    would stop for want of memory (none left for the KV cache, a state slot or one request), the plan holds no
    tokens; where it would stop on an assertion about the settings, the plan says so in the engine's words
    (`engine_refusal`)."""
    weights = (target_weight_bytes + drafter_weight_bytes) // tp_size
    before = card_bytes - cuda_unseen_bytes(card_bytes) - resident_before_load(tp_size)
    after = before - weights
    context = context_length or target.context_length
    if max_running_requests is None and draft_tokens:
        max_running_requests = SPECULATIVE_MAX_RUNNING_REQUESTS
    per_token = target.bytes_per_token + (drafter.bytes_per_token if drafter else 0)
    hybrid = target.state_bytes_per_request > 0

    def stopped(assertion: str | None = None) -> CapacityPlan:
        return CapacityPlan(replica, 0, per_token, 0, 0, 0, typical_request_tokens, 0, 0, before, after, assertion)

    # In GiB as floats, as the engine computes it (get_available_gpu_memory answers GiB).
    rest = after / GIB - before / GIB * (1 - mem_fraction_static) - (MULTIMODAL_RESERVE_BYTES / GIB if target.multimodal
                                                                     else 0)
    state_gib, slots, ratio = 0.0, 0, 1
    if hybrid:
        strategy, overlap = resolved_mamba_strategy(mamba_strategy, overlap_schedule, page_size)
        try:
            ratio = mamba_slots_per_request(strategy, overlap, radix_cache)
        except ValueError as assertion:
            return stopped(f"AssertionError: {assertion}")
        slots, intermediate = _state_slots(rest, target.state_bytes_per_request, draft_tokens, ratio, radix_cache,
                                           max_running_requests, mamba_full_memory_ratio)
        if slots <= 0:  # the engine's RuntimeError: "Not enough GPU memory for hybrid ... state cache"
            return stopped()
        state_gib = intermediate + (slots + 1) * target.state_bytes_per_request / GIB
        rest -= state_gib
    if rest <= 0:  # the engine's ValueError: "Loaded weights leave no GPU memory for the KV cache"
        return stopped()
    pool = int(rest * GIB)
    tokens = pool // per_token // page_size * page_size
    if max_total_tokens:
        tokens = min(tokens, max_total_tokens) // page_size * page_size
    running = _max_running_requests(tokens, context, max_running_requests, slots // ratio if hybrid else None)
    if running <= 0 or min(context, tokens) - 1 <= 0:  # resolve_max_num_reqs's RuntimeError, max_req_len's assertion
        return stopped()
    concurrent = min(tokens // typical_request_tokens, running)
    return CapacityPlan(replica, pool, per_token, tokens, int(state_gib * GIB), concurrent, typical_request_tokens,
                        running, min(context, tokens) - 1, before, after)


def _state_slots(rest_gib: float, per_slot: int, draft_tokens: int, ratio: int, radix_cache: bool,
                 max_running_requests: int | None, full_memory_ratio: float) -> tuple[int, float]:
    """The recurrent-state slots SGLang allocates (max_mamba_cache_size) and the GiB of speculative intermediate
    states beside them (kv_cache_configurator.py _handle_max_mamba_cache): without the radix cache one slot per
    running request; else its share of the rest, solved jointly with an intermediate state per draft token for
    each of min(max_running_requests, slots / ratio) + 1 requests. One more slot is the pool's padding."""
    if not radix_cache and max_running_requests is not None:
        slots = max(1, max_running_requests)
        return slots, (per_slot * (slots + 1) * draft_tokens / GIB if draft_tokens else 0.0)
    budget = rest_gib * full_memory_ratio / (1 + full_memory_ratio) * GIB
    if not draft_tokens:
        return int((budget - per_slot) // per_slot), 0.0
    slots = int((budget - per_slot * (1 + draft_tokens)) // (per_slot * (1 + draft_tokens / ratio)))
    requests = min(max(1, max_running_requests or 1), slots // ratio)
    return slots, per_slot * (requests + 1) * draft_tokens / GIB


def _max_running_requests(tokens: int, context: int, asked: int | None, state_cap: int | None) -> int:
    # kv_cache_configurator.py resolve_max_num_reqs: what was asked (else 512 requests per context's worth of
    # tokens, within 2048-4096), at most half the tokens, and on a hybrid model its state slots / slots a request.
    running = min(asked if asked is not None else max(min(int(tokens / context * 512), 4096), 2048), tokens // 2)
    return running if state_cap is None else min(running, state_cap)


def plan_server(replica: str, args: list[str], *, card_bytes: int, target_config: dict, target_weight_bytes: int,
                drafter_config: dict | None = None, drafter_weight_bytes: int = 0, draft_kv_of_target: bool = False,
                typical_request_tokens: int = TYPICAL_REQUEST_TOKENS) -> CapacityPlan:
    """
    One replica's plan (plan_replica) from its SGLang command line `args` as the deploy renders it, read as
    argparse reads it (command_line.value), and its models' config.json; `draft_kv_of_target`: the engine sizes
    its draft's KV as the target's cell per draft layer (check_draft_kv_of_target); NoRule for a model the
    planner cannot size.

    .. code:: python

        plan = capacity.plan_server(replica.service_name, server_args(replica), card_bytes=97887 << 20,
                                    target_config=hub.config, target_weight_bytes=hub.weight_bytes)
    """
    def number(flag: str, default, kind=int):
        found = value(args, flag)
        try:
            return default if found is None else kind(found)
        except ValueError:
            raise NoRule(f"{flag} {found!r}: the KV-cache planner reads a number there") from None

    tp_size = number("--tp-size", 1)
    kv_dtype = value(args, "--kv-cache-dtype") or "auto"
    drafter = None
    if draft_kv_of_target:
        check_draft_kv_of_target(target_config, drafter_config)
    elif drafter_config is not None:
        draft_dtype = draft_kv_cache_dtype(kv_dtype, value(args, "--speculative-draft-attention-backend"),
                                           value(args, "--speculative-draft-kv-cache-dtype"))
        drafter = kv_geometry(drafter_config, tp_size, draft_dtype)
    return plan_replica(
        replica, card_bytes=card_bytes, mem_fraction_static=number("--mem-fraction-static", 0.9, float),
        tp_size=tp_size, target_weight_bytes=target_weight_bytes, drafter_weight_bytes=drafter_weight_bytes,
        target=kv_geometry(target_config, tp_size, kv_dtype), drafter=drafter,
        typical_request_tokens=typical_request_tokens,
        draft_tokens=number("--speculative-num-draft-tokens", 0) if value(args, "--speculative-algorithm") else 0,
        max_total_tokens=number("--max-total-tokens", None), page_size=number("--page-size", 1),
        context_length=number("--context-length", None), max_running_requests=number("--max-running-requests", None),
        mamba_strategy=value(args, "--mamba-radix-cache-strategy") or "auto",
        overlap_schedule="--disable-overlap-schedule" not in args, radix_cache="--disable-radix-cache" not in args,
        mamba_full_memory_ratio=number("--mamba-full-memory-ratio", MAMBA_FULL_MEMORY_RATIO, float))


def refusal(plan: CapacityPlan, min_tokens: int, full_context: bool = False) -> str | None:
    """The one line a caller prints when `plan` holds fewer than `min_tokens` (the min_kv_tokens knob, or
    with `full_context` its default: one full context of the model), or where SGLang's startup would stop
    (`engine_refusal`: the engine's words), else None."""
    if plan.engine_refusal:
        return (f"{plan.replica}: SGLang 0.5.23 would stop sizing its memory pool, after loading the weights: "
                f"{plan.engine_refusal}")
    if plan.tokens >= min_tokens:
        return None
    wanted = (f"one full context ({min_tokens} tokens, the min_kv_tokens default)" if full_context
              else f"min_kv_tokens {min_tokens}")
    return (f"{plan.replica}: its KV cache holds {plan.tokens} tokens ({plan.pool_bytes / GIB:.1f} GiB a GPU at "
            f"{plan.bytes_per_token} bytes a token), fewer than {wanted}: run fewer replicas, "
            f"a larger tp_size, an fp8 KV cache (--kv-cache-dtype fp8_e4m3) or a shorter --context-length")


def described(plan: CapacityPlan) -> str:
    """What a plan says in preflight's line: the tokens a replica holds and the requests they serve."""
    return (f"KV cache {plan.tokens:,} tokens, {plan.concurrent_requests} requests of "
            f"{plan.request_tokens:,} tokens")


def engine_shortfall(replica: str, planned_tokens: int, engine_tokens: int) -> str | None:
    """The sentence when a running replica's engine holds fewer tokens than `planned_tokens` by more than
    ENGINE_TOLERANCE, else None."""
    if engine_tokens >= planned_tokens * (1 - ENGINE_TOLERANCE):
        return None
    short = 1 - engine_tokens / planned_tokens
    return (f"{replica}: its engine holds {engine_tokens:,} tokens (max_total_num_tokens in /server_info), "
            f"{short:.0%} fewer than the {planned_tokens:,} planned, beyond the {ENGINE_TOLERANCE:.0%} tolerance: "
            f"something else holds GPU memory (nvidia-smi --query-compute-apps=pid,used_memory) or the plan "
            f"misreads the model (deployment/server/capacity.py)")
