"""LAB STAND-IN for how SGLang 0.5.23 sizes its KV pool: the `max_total_num_tokens` a scheduler reports.

The real steps (paths inside the 0.5.23 wheel), and what the stand-in, which loads nothing onto a GPU, takes
for each:

1. The free memory before the weights load, the smallest over the ranks (distributed/bootstrap.py
   measure_pre_model_load_memory): the stand-in takes the GPU's memory.total from nvidia-smi (on a lab host
   the GPU stand-in's profile, the cards' real memory). It holds no CUDA context, which a real rank has
   resident by then (~0.5 GiB): the one step where the stand-in knows less than the engine.
2. The free memory once the weights are loaded (kv_cache_configurator.py _profile_available_bytes,
   get_available_gpu_memory): the first figure less this rank's weights. The stand-in has no weights in GPU
   memory; it takes the sizes of the *.safetensors files of --model-path and of the drafter's path, split
   evenly over the TP ranks: what the real loader puts on each rank's GPU, bar the few tensors it replicates.
3. rest = that free memory - pre-load memory x (1 - mem_fraction_static) - a multimodal model's 100 MB
   (mm_runtime_reservation_gb, SGLANG_VLM_CACHE_SIZE_MB; Kimi K2.5/K2.6 and Qwen3.5/3.6 are multimodal
   architectures, configs/model_config.py multimodal_model_archs); a hybrid model first gives its recurrent
   state slots their share (_handle_max_mamba_cache).
4. tokens = rest // bytes a token (model_executor/pool_configurator.py DefaultPoolConfigurator: the target's
   cell, _compute_cell_size, plus a DFlash drafter's, dflash_draft_cell_size_per_token), rounded down to the
   page size (calculate_pool_sizes), at most --max-total-tokens (_apply_token_constraints).

The post-capture re-sizing (model_runner_components/kv_pool_runtime.py) runs only with
SGLANG_ENABLE_POST_CAPTURE_KV_SIZING, off by default (environ.py), and never for MLA: not modelled.
tests/lab_code/test_sglang_kv_pool.py checks these figures against the wheel's own functions.
"""

from pathlib import Path

GIB = 1 << 30
# srt/mem_cache/kv_cache_dtype.py: --kv-cache-dtype's element size; "auto" is the model's dtype.
KV_DTYPE_BYTES = {"fp8_e4m3": 1, "fp8_e5m2": 1, "mxfp8": 1, "bf16": 2, "bfloat16": 2}
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}
MULTIMODAL_ARCHS = {"KimiK25ForConditionalGeneration", "Qwen3_5ForConditionalGeneration",
                    "Qwen3_5MoeForConditionalGeneration"}
VLM_CACHE_SIZE_MB = 100  # environ.py SGLANG_VLM_CACHE_SIZE_MB
MLA_ARCHS = {"DeepseekV3ForCausalLM", "DeepseekV2ForCausalLM", "KimiK25ForConditionalGeneration"}
MAMBA_RATIO = 3  # kv_cache_configurator.py MAMBA_CACHE_SIZE_MAX_RUNNING_REQUESTS_RATIO
MAMBA_FULL_MEMORY_RATIO = 0.9  # arg_groups/fields/schedule.py, mamba_full_memory_ratio's fallback


def _text(config: dict) -> dict:
    return config.get("text_config") or config


def _dtype_bytes(text: dict) -> int:
    return DTYPE_BYTES[text.get("dtype") or text.get("torch_dtype") or "bfloat16"]


def _kv_bytes(kv_cache_dtype: str, text: dict) -> int:
    return _dtype_bytes(text) if kv_cache_dtype in (None, "auto") else KV_DTYPE_BYTES[kv_cache_dtype]


def _full_attention_layers(text: dict) -> list[int]:
    """configs/qwen3_5.py, qwen3_next.py full_attention_layer_ids: layer_types, else every interval-th."""
    if "layer_types" in text:
        return [i for i, kind in enumerate(text["layer_types"]) if kind == "full_attention"]
    if "full_attention_interval" in text:
        return [i for i in range(text["num_hidden_layers"]) if (i + 1) % text["full_attention_interval"] == 0]
    return list(range(text["num_hidden_layers"]))


def _kv_heads(text: dict, tp: int) -> int:
    """configs/model_config.py get_num_kv_heads: the KV heads over the TP ranks, at least one."""
    return max(1, text.get("num_key_value_heads", text["num_attention_heads"]) // tp)


def _head_dims(text: dict) -> int:
    head_dim = text.get("head_dim") or text["hidden_size"] // text["num_attention_heads"]
    return head_dim + text.get("v_head_dim", head_dim)


def target_cell_bytes(config: dict, tp: int, kv_cache_dtype: str) -> int:
    """_compute_cell_size: MLA (kv_lora_rank + qk_rope_head_dim a layer, every rank alike), else K and V a KV
    head a layer, on a hybrid model's full-attention layers only."""
    text, arch = _text(config), (config.get("architectures") or [""])[0]
    size = _kv_bytes(kv_cache_dtype, text)
    if arch in MLA_ARCHS:
        return (text["kv_lora_rank"] + text["qk_rope_head_dim"]) * text["num_hidden_layers"] * size
    return _kv_heads(text, tp) * _head_dims(text) * len(_full_attention_layers(text)) * size


def draft_cell_bytes(config: dict, tp: int, kv_cache_dtype: str) -> int:
    """speculative/dflash_utils.py dflash_draft_cell_size_per_token."""
    text = _text(config)
    return _kv_heads(text, tp) * _head_dims(text) * text["num_hidden_layers"] * _kv_bytes(kv_cache_dtype, text)


def mamba_state_bytes(config: dict, tp: int, ssm_dtype: str | None) -> int:
    """configs/mamba_utils.py mamba_cache_per_req for a Gated DeltaNet model (qwen3_next.py
    mamba2_cache_params): conv state and temporal state of every linear-attention layer; 0 for a model
    without such layers."""
    text = _text(config)
    if "linear_num_value_heads" not in text:
        return 0
    k_heads, v_heads = text["linear_num_key_heads"], text["linear_num_value_heads"]
    k_dim, v_dim = text["linear_key_head_dim"], text["linear_value_head_dim"]
    conv = (v_heads * v_dim + 2 * k_heads * k_dim) // tp * (text["linear_conv_kernel_dim"] - 1)
    temporal = v_heads // tp * v_dim * k_dim
    ssm = DTYPE_BYTES[ssm_dtype or text.get("mamba_ssm_dtype") or "float32"]
    linear = text["num_hidden_layers"] - len(_full_attention_layers(text))
    return (conv * _dtype_bytes(text) + temporal * ssm) * linear


def weight_bytes(*model_dirs: str | None) -> int:
    """The *.safetensors files' sizes of the given model folders (what the loader puts on the GPUs)."""
    return sum(f.stat().st_size for d in model_dirs if d for f in Path(d).glob("*.safetensors"))


def _mamba_ratio(args) -> int:
    """_calculate_mamba_ratio: state slots a running request takes."""
    if args.disable_radix_cache:
        return 1
    strategy = args.mamba_radix_cache_strategy
    if strategy == "auto":  # arg_groups/overrides.py picks one from the overlap, the page size and the model
        raise ValueError("the lab stand-in does not resolve --mamba-radix-cache-strategy auto: set it")
    if strategy not in ("extra_buffer", "extra_buffer_lazy"):
        return MAMBA_RATIO
    # mem_cache/allocation_sizing.py get_mamba_tracking_slots
    return MAMBA_RATIO + (1 if strategy == "extra_buffer_lazy" or args.disable_overlap_schedule else 2)


def _after_mamba_state(args, rest_gib: float, per_req: int) -> float:
    """_handle_max_mamba_cache, its sizing from the budget (no --max-mamba-cache-size): the state slots
    take mamba_full_memory_ratio / (1 + ratio) of the rest, with a draft token's intermediate state per
    running request under speculation; what is left goes to the KV cache."""
    if args.max_mamba_cache_size is not None:
        raise NotImplementedError("the lab stand-in sizes the mamba cache from the budget only")
    ratio = args.mamba_full_memory_ratio or MAMBA_FULL_MEMORY_RATIO
    budget = rest_gib * ratio / (1 + ratio) * GIB
    if args.speculative_algorithm:
        draft = args.speculative_num_draft_tokens
        slots = int((budget - per_req * (1 + draft)) // (per_req * (1 + draft / _mamba_ratio(args))))
        capped = min(max(1, args.max_running_requests), slots // _mamba_ratio(args))
        rest_gib -= per_req * (capped + 1) * draft / GIB
    else:
        slots = int((budget - per_req) // per_req)
    if slots <= 0:
        raise RuntimeError("Not enough GPU memory for hybrid (mamba/linear-attention) state cache. "
                           f"Computed max_mamba_cache_size={slots}")
    return rest_gib - (slots + 1) * per_req / GIB


def max_total_num_tokens(args, target: dict, draft: dict | None, card_mib: float) -> int:
    """The tokens one rank's pool holds, for resolved server `args` on a card of `card_mib` MiB."""
    if args.mem_fraction_static is None:  # the real one picks it from the card (arg_groups/memory_hook.py)
        raise ValueError("the lab stand-in does not model SGLang's choice of --mem-fraction-static: set it")
    tp = args.tp_size
    pre = card_mib / 1024
    loaded = pre - weight_bytes(args.model_path, args.speculative_draft_model_path if draft else None) / tp / GIB
    rest = loaded - pre * (1 - args.mem_fraction_static)
    if (target.get("architectures") or [""])[0] in MULTIMODAL_ARCHS:
        rest -= VLM_CACHE_SIZE_MB / 1024
    state = mamba_state_bytes(target, tp, args.mamba_ssm_dtype)
    if state:
        rest = _after_mamba_state(args, rest, state)
    if rest <= 0:
        raise ValueError(f"Loaded weights leave no GPU memory for the KV cache under "
                         f"--mem-fraction-static={args.mem_fraction_static}. "
                         f"Raise --mem-fraction-static above {1 - loaded / pre:.3f}")
    cell = target_cell_bytes(target, tp, args.kv_cache_dtype)
    if draft is not None and args.speculative_algorithm in ("DFLASH", "DDTREE"):
        cell += draft_cell_bytes(draft, tp, args.speculative_draft_kv_cache_dtype or args.kv_cache_dtype)
    tokens = int(rest * GIB) // cell
    if args.max_total_tokens:
        tokens = min(tokens, args.max_total_tokens)
    page = args.page_size or 1
    return tokens // page * page
