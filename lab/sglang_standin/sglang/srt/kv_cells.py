"""LAB STAND-IN's reading of what one token and one request take in SGLang 0.5.23's memory pools, from a
model's config.json: the target's KV cell (model_executor/pool_configurator.py _compute_cell_size), a DFlash
drafter's (speculative/dflash_utils.py dflash_draft_cell_size_per_token) and a hybrid model's recurrent state
(configs/mamba_utils.py mamba_cache_per_req). The release computes them from torch dtypes and its config
classes, which a lab host lacks; tests/lab_code/test_sglang_kv_pool.py holds these figures to the wheel's own
functions, for the real models' configs.
"""

GIB = 1 << 30
# srt/mem_cache/kv_cache_dtype.py: --kv-cache-dtype's element size; "auto" is the model's dtype.
KV_DTYPE_BYTES = {"fp8_e4m3": 1, "fp8_e5m2": 1, "mxfp8": 1, "bf16": 2, "bfloat16": 2}
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}
MLA_ARCHS = {"DeepseekV3ForCausalLM", "DeepseekV2ForCausalLM", "KimiK25ForConditionalGeneration"}


def _text(config: dict) -> dict:
    return config.get("text_config") or config


def _dtype_bytes(text: dict) -> int:
    return DTYPE_BYTES[text.get("dtype") or text.get("torch_dtype") or "bfloat16"]


def _kv_bytes(kv_cache_dtype: str, text: dict) -> int:
    return _dtype_bytes(text) if kv_cache_dtype in (None, "auto") else KV_DTYPE_BYTES[kv_cache_dtype]


def full_attention_layers(text: dict) -> list[int]:
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
    return _kv_heads(text, tp) * _head_dims(text) * len(full_attention_layers(text)) * size


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
    linear = text["num_hidden_layers"] - len(full_attention_layers(text))
    return (conv * _dtype_bytes(text) + temporal * ssm) * linear
