"""How many tokens one replica's KV cache holds: its pool from the card, the weights and a reserve, and the
bytes a token takes there from the model's config.json, as SGLang 0.5.23 sizes them.

Pure: plain values in, frozen plans out. Per GPU of a replica (SGLang sizes the pool per rank, every rank alike):

    pool   = card_bytes x mem_fraction_static - target_weights / tp - drafter_weights / tp - RESERVE_BYTES
    tokens = pool // (target bytes per token + drafter bytes per token)

A hybrid model (linear-attention + full-attention layers) first gives its recurrent state its share of the
pool, and its tokens are counted in the rest.

>>> kimi = {"architectures": ["KimiK25ForConditionalGeneration"],
...         "text_config": {"num_hidden_layers": 61, "kv_lora_rank": 512, "qk_rope_head_dim": 64,
...                         "torch_dtype": "bfloat16"}}
>>> geometry = kv_geometry(kimi, tp_size=8, kv_cache_dtype="auto")
>>> geometry.bytes_per_token
70272
>>> plan = plan_replica("sglang@kimi-gpu0-7", card_bytes=180 * GIB, mem_fraction_static=0.9, tp_size=8,
...                     target_weight_bytes=595 * 10**9, drafter_weight_bytes=0, target=geometry,
...                     typical_request_tokens=8192)
>>> plan.tokens, plan.concurrent_requests
(1401659, 171)
"""

from dataclasses import dataclass
from typing import Callable

GIB = 1 << 30
# The prompt and output of a typical request, for the concurrent requests a plan states: a long chat turn
# or a coding agent's step (no profile names its own).
TYPICAL_REQUEST_TOKENS = 8192
# Resident on each GPU when SGLang measures its free memory after loading (CUDA context, cuBLAS and NCCL
# workspaces), which mem_fraction_static does not cover: SGLang's budget is the free memory then, less
# (1 - mem_fraction_static) of the memory free before the load (0.5.23 mem_cache/kv_cache_configurator.py,
# KVCacheConfigurator._profile_available_bytes). An estimate, not measured on these cards (the CUDA
# context alone takes ~0.5 GiB on Hopper/Blackwell): the engine's own max_total_num_tokens is what checks it.
RESERVE_BYTES = 1 * GIB
# How far below its plan a running replica's own max_total_num_tokens (its /server_info) may fall before the
# plan counts as wrong: the reserve above is an estimate. 10% of the smallest shipped pool (Kimi K2.6 at TP 8
# on the RTX PRO 6000, ~15 GiB a GPU) is ~1.5 GiB: the engine may find up to ~2.5 GiB a GPU resident where
# the plan set aside 1 GiB, and it rounds to its page size and reserves 100 MB for a multimodal model.
ENGINE_TOLERANCE = 0.10
# A hybrid model's recurrent state gets mamba_full_memory_ratio of the KV cache's memory when the radix
# cache is on (SGLang's default): 0.9, so 0.9/1.9 of the budget (0.5.23 srt/arg_groups/fields/schedule.py,
# mamba_full_memory_ratio fallback; kv_cache_configurator.py _handle_max_mamba_cache, mamba_budget).
MAMBA_FULL_MEMORY_RATIO = 0.9
# State slots per running request with the radix cache (kv_cache_configurator.py,
# MAMBA_CACHE_SIZE_MAX_RUNNING_REQUESTS_RATIO); --mamba-radix-cache-strategy extra_buffer_lazy adds one
# (_calculate_mamba_ratio, mem_cache/allocation_sizing.py get_mamba_tracking_slots).
MAMBA_SLOTS_PER_REQUEST = 3

# --kv-cache-dtype: bytes per element (0.5.23 srt/mem_cache/kv_cache_dtype.py, configure_kv_cache_dtype;
# "auto" is the model's dtype).
KV_DTYPE_BYTES = {"fp8_e4m3": 1, "fp8_e5m2": 1, "bf16": 2, "bfloat16": 2, "float16": 2, "fp16": 2}
MODEL_DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}


class NoRule(ValueError):
    """An architecture, a KV dtype or a TP split the planner has no rule for: it says so in one line rather
    than guess."""


@dataclass(frozen=True)
class KVGeometry:
    """What one token and one running request take on one GPU of a replica."""

    architecture: str
    bytes_per_token: int  # the KV cache, on one rank
    state_bytes_per_request: int = 0  # a hybrid model's recurrent (Mamba/GDN) state slot, on one rank


@dataclass(frozen=True)
class CapacityPlan:
    """One replica's KV pool, on each of its GPUs."""

    replica: str
    pool_bytes: int  # what the KV cache gets, per GPU
    bytes_per_token: int  # target's and drafter's KV together
    tokens: int  # what the replica holds (every rank holds the same tokens)
    state_bytes: int  # the recurrent state's share, per GPU (hybrid models; else 0)
    concurrent_requests: int  # of request_tokens each, limited by the state slots on a hybrid model
    request_tokens: int  # a typical request's prompt and output


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
        return rule(text, tp_size, _dtype_bytes(kv_cache_dtype, text))
    except (KeyError, TypeError, ZeroDivisionError) as error:  # a config of that architecture, malformed
        raise NoRule(f"architecture {architectures[0]}: its config.json lacks or mistypes {error}, which its "
                     "rule reads") from None


def plan_replica(replica: str, *, card_bytes: int, mem_fraction_static: float, tp_size: int,
                 target_weight_bytes: int, drafter_weight_bytes: int, target: KVGeometry,
                 drafter: KVGeometry | None = None, typical_request_tokens: int = TYPICAL_REQUEST_TOKENS,
                 draft_tokens: int = 0,
                 mamba_slots_per_request: int = MAMBA_SLOTS_PER_REQUEST,
                 reserve_bytes: int = RESERVE_BYTES, max_total_tokens: int | None = None,
                 page_size: int = 1) -> CapacityPlan:
    """One replica's plan: its KV pool per GPU, the tokens it holds and the concurrent requests of
    `typical_request_tokens` (prompt + output) those serve; on a hybrid model no more than its state slots
    hold, with `draft_tokens` per verify step under speculation. Weights split evenly across the TP ranks.
    The tokens are at most `max_total_tokens` (--max-total-tokens) and whole pages of `page_size`
    (--page-size), as SGLang caps and rounds its pool (0.5.23 mem_cache/kv_cache_configurator.py)."""
    weights = (target_weight_bytes + drafter_weight_bytes) / tp_size
    budget = max(int(card_bytes * mem_fraction_static - weights - reserve_bytes), 0)
    hybrid = target.state_bytes_per_request > 0
    state = int(budget * MAMBA_FULL_MEMORY_RATIO / (1 + MAMBA_FULL_MEMORY_RATIO)) if hybrid else 0
    pool = budget - state
    per_token = target.bytes_per_token + (drafter.bytes_per_token if drafter else 0)
    tokens = pool // per_token
    if max_total_tokens:
        tokens = min(tokens, max_total_tokens)
    tokens = tokens // page_size * page_size
    requests = tokens // typical_request_tokens
    if hybrid:
        slots = _state_slots(state, target.state_bytes_per_request, draft_tokens, mamba_slots_per_request)
        requests = min(requests, slots // mamba_slots_per_request)
    return CapacityPlan(replica, pool, per_token, tokens, state, requests, typical_request_tokens)


def _state_slots(state_bytes: int, per_slot: int, draft_tokens: int, slots_per_request: int) -> int:
    # The recurrent-state slots SGLang fits in its share (kv_cache_configurator.py, _handle_max_mamba_cache):
    # one slot is padding; under speculation every running request also keeps an intermediate state per
    # draft token, solved jointly with the slots.
    if draft_tokens:
        slots = (state_bytes - per_slot * (1 + draft_tokens)) // (per_slot * (1 + draft_tokens / slots_per_request))
    else:
        slots = (state_bytes - per_slot) // per_slot
    return max(int(slots), 0)


def refusal(plan: CapacityPlan, min_tokens: int, full_context: bool = False) -> str | None:
    """The one line a caller prints when `plan` holds fewer than `min_tokens` (the min_kv_tokens knob, or
    with `full_context` its default: one full context of the model), else None."""
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
            f"misreads the model (operations/server/capacity.py)")
