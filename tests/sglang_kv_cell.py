"""Run in the real-SGLang env (tests/sglang_real.py, run_with_real_sglang): the bytes one token takes in the
KV pool, and one request's recurrent state, as SGLang 0.5.23's own code computes them for a model directory.

Per case {"path": a directory holding config.json, "tp": TP size, "kv_cache_dtype": --kv-cache-dtype}:
- the model's config is read by SGLang's ModelConfig (srt/configs/model_config.py), its own config classes
  (KimiK25Config, Qwen3_5Config) included;
- the per-token size is DefaultPoolConfigurator._compute_cell_size (srt/model_executor/pool_configurator.py),
  the function the target's pool is sized by, called on the layers it counts: a hybrid model's full-attention
  layers (mambaish_config(...).full_attention_layer_ids, as DefaultPoolConfigurator.__init__ does), else all;
- the KV dtype is configure_kv_cache_dtype (srt/mem_cache/kv_cache_dtype.py);
- a hybrid model's per-request state is mamba2_cache_params.mamba_cache_per_req (srt/configs/mamba_utils.py),
  what KVCacheConfigurator._handle_max_mamba_cache charges per state slot.
A drafter case ({"draft": true}) is priced by dflash_draft_cell_size_per_token (srt/speculative/dflash_utils.py),
what the target's pool adds for a DFlash drafter's KV (mem_cache/draft_kv_budget.py): that function's own text,
taken out of the module, whose other imports (speculative/spec_utils.py: einops and the scheduler) this env
does not install.

Only the runtime's parallel state is stood in for (one TP group of `tp` ranks, no DCP/CP/PP): there is no
torch.distributed here. Answers @@RESULT@@{"cases": [{"cell_size", "state_bytes"} or {"error"}]}.
"""

import json
import sys
import types


def _parallel(tp: int):
    return types.SimpleNamespace(attn_tp_size=tp, attn_dcp_size=1, attn_cp_size=1, tp_size=tp, pp_size=1,
                                 attn_dp_size=1, attn_tp_rank=0, moe_tp_size=tp, launch_world_size=tp,
                                 enable_cp_tp_group_sharing=False, enable_dsa_cache_layer_split=False)


def _install_parallel(tp: int) -> None:
    import sglang.srt.layers.cp.utils as cp_utils
    import sglang.srt.model_executor.pool_configurator as pool
    import sglang.srt.runtime_context as ctx

    par = _parallel(tp)
    for module in (ctx, pool, cp_utils):
        module.get_parallel = lambda par=par: par


def dflash_utils_function(name: str):
    """A function of srt/speculative/dflash_utils.py, its text taken out of the module (whose other imports
    this env does not install)."""
    import ast
    import importlib.util
    from pathlib import Path
    from typing import Any, Optional

    import torch

    source = Path(importlib.util.find_spec("sglang.srt.speculative.dflash_utils").origin).read_text()
    (node,) = [n for n in ast.parse(source).body if isinstance(n, ast.FunctionDef) and n.name == name]
    namespace = {"torch": torch, "Any": Any, "Optional": Optional}
    exec(compile(ast.Module(body=[node], type_ignores=[]), "dflash_utils.py", "exec"), namespace)
    return namespace[name]


def cell_figures(case: dict) -> dict:
    from sglang.srt.configs.hybrid_arch import mambaish_config
    from sglang.srt.configs.model_config import AttentionArch, ModelConfig
    from sglang.srt.mem_cache.kv_cache_dtype import configure_kv_cache_dtype
    from sglang.srt.model_executor.pool_configurator import DefaultPoolConfigurator

    _install_parallel(case["tp"])
    mc = ModelConfig(case["path"], trust_remote_code=False, is_draft_model=case.get("draft", False))
    _, kv_dtype = configure_kv_cache_dtype(
        server_args_kv_cache_dtype=case["kv_cache_dtype"], speculative_draft_kv_cache_dtype=None, model=None,
        model_dtype=mc.dtype, is_draft_worker=case.get("draft", False), is_dflash=case.get("draft", False),
        speculative_draft_attention_backend=None,
    )
    if case.get("draft"):
        return {"cell_size": dflash_utils_function("dflash_draft_cell_size_per_token")(
            draft_model_config=mc, draft_num_layers=mc.num_hidden_layers, draft_kv_cache_dtype=kv_dtype,
            tp_size=case["tp"]), "state_bytes": 0}
    mamba = mambaish_config(mc)
    num_layers = len(mamba.full_attention_layer_ids) if mamba else mc.num_hidden_layers
    kvc = types.SimpleNamespace(
        model_config=mc, kv_cache_dtype=kv_dtype, kv_cache_dtype_str=case["kv_cache_dtype"],
        use_mla_backend=mc.attention_arch == AttentionArch.MLA, is_draft_worker=False,
        server_args=types.SimpleNamespace(enable_hisparse=False),
    )
    pool = DefaultPoolConfigurator.__new__(DefaultPoolConfigurator)
    pool.kv_cache_dtype_str = kvc.kv_cache_dtype_str  # the first thing DefaultPoolConfigurator.__init__ sets
    cell = pool._compute_cell_size(kvc, num_layers)
    state = mamba.mamba2_cache_params.mamba_cache_per_req if mamba else 0
    return {"cell_size": int(cell), "state_bytes": int(state)}


def answer(figures) -> None:
    """`figures` of every case on stdin, as the @@RESULT@@ line run_with_real_sglang reads."""
    results = []
    for case in json.load(sys.stdin)["cases"]:
        try:
            results.append(figures(case))
        except Exception as e:  # noqa: BLE001 - the test reports it
            results.append({"error": f"{type(e).__name__}: {e}"})
    print("@@RESULT@@" + json.dumps({"cases": results}))


if __name__ == "__main__":
    answer(cell_figures)
