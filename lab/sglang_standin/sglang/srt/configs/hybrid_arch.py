"""LAB STAND-IN for SGLang 0.5.23's srt/configs/hybrid_arch.py mambaish_config: a hybrid (linear-attention)
model's full-attention layers and the recurrent state a request takes on the others, on one TP rank
(configs/qwen3_next.py mamba2_cache_params, configs/mamba_utils.py mamba_cache_per_req; the bytes as
srt/kv_cells.py reads them, checked against the wheel in tests/lab_code/test_sglang_kv_pool.py)."""

from types import SimpleNamespace

from sglang.srt import kv_cells
from sglang.srt.runtime_context import get_model, get_parallel


def mambaish_config(model_config):
    """None for a model without linear-attention layers."""
    config = model_config.config
    per_request = kv_cells.mamba_state_bytes(config, get_parallel().attn_tp_size, get_model().mamba_ssm_dtype)
    if not per_request:
        return None
    text = config.get("text_config") or config
    full = kv_cells.full_attention_layers(text)
    linear = [i for i in range(text["num_hidden_layers"]) if i not in full]
    return SimpleNamespace(full_attention_layer_ids=full,
                           mamba2_cache_params=SimpleNamespace(layers=linear, mamba_cache_per_req=per_request))
