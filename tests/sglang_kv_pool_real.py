"""Run in the real-SGLang env (tests/sglang_real.py, run_with_real_sglang): what SGLang 0.5.23's own startup
code makes of a model directory, a card and the weights it loaded: the pool's tokens, the cap on running
requests, the longest request, or the refusal it dies of.

Per case {"target", "draft" (or null): directories holding config.json, "tp", "kv_cache_dtype", "pre_gib": the
free memory before the load, "loaded_gib": the free memory after it, "mem_fraction_static", "page_size",
"max_total_tokens", "algorithm", "num_draft_tokens", "max_running_requests", "disable_radix_cache",
"mamba_radix_cache_strategy", "disable_overlap_schedule", "context_length"}, the wheel's own
KVCacheConfigurator._resolve_memory_pool_config (srt/mem_cache/kv_cache_configurator.py), which chains
_profile_available_bytes (the slack, the multimodal reservation, a hybrid model's state slots through
_handle_max_mamba_cache and _calculate_mamba_ratio, with get_available_gpu_memory answering "loaded_gib"),
config_from_budget (DefaultPoolConfigurator.calculate_pool_sizes, _apply_token_constraints) and
resolve_max_num_reqs; the context is the wheel's ModelConfig's, and the longest request is
managers/tp_worker.py's min(context - 1, tokens - 1).
The bytes a token takes are the target's and a DFlash drafter's cells as tests/sglang_kv_cell.py computes
them (DefaultPoolConfigurator._compute_cell_size, dflash_draft_cell_size_per_token), summed by
scale_kv_cell_size_per_token_for_dflash (srt/speculative/dflash_utils.py), as DefaultPoolConfigurator.__init__
does; create_memory_pool_configurator answers with that configurator (the default layout's).
Only the runtime's context (parallel state, the resolved argument groups) is stood in for: one TP group of
`tp` ranks, no PP/DCP, no disaggregation. Answers @@RESULT@@{"cases": [{"max_total_num_tokens",
"max_running_requests", "max_req_len", "context_len"} or {"error"}]}.
"""

from types import SimpleNamespace as NS

# The script's folder is first on sys.path: tests/sglang_kv_cell.py, the cells as the planner's test computes them.
from sglang_kv_cell import _install_parallel, _parallel, answer, cell_figures, dflash_utils_function


def _context(case: dict):
    """The argument groups the configurator reads (srt/runtime_context.py), resolved as the case says."""
    strategy = case["mamba_radix_cache_strategy"]
    extra = not case["disable_radix_cache"] and strategy in ("extra_buffer", "extra_buffer_lazy")
    schedule = NS(mem_fraction_static=case["mem_fraction_static"], prefill_max_requests=None,
                  max_mamba_cache_size=None, mamba_full_memory_ratio=0.9,  # fields/schedule.py's fallback
                  max_running_requests=case["max_running_requests"], page_size=case["page_size"],
                  disable_overlap_schedule=case["disable_overlap_schedule"], max_total_tokens=case["max_total_tokens"])
    graph = NS(cuda_graph_config=NS(prefill=NS(full_prefill_max_req=None, backend=None)))
    exec_ = NS(graph=graph, mamba=NS(enable_mamba_extra_buffer=extra,
                                     enable_mamba_extra_buffer_lazy=extra and strategy == "extra_buffer_lazy",
                                     enable_linear_replayssm_spec=False))

    def override(_name, **values):  # what runtime_context's override does to the bags: set the resolved values
        for key, value in values.items():
            setattr(schedule, key, value)

    return {"get_schedule": lambda: schedule, "get_exec": lambda: exec_,
            "get_disagg": lambda: NS(disaggregation_mode="null"), "get_mm": lambda: NS(mm_feature_transport=None),
            "get_memory": lambda: NS(disable_radix_cache=case["disable_radix_cache"], enable_unified_memory=False),
            "get_spec": lambda: NS(speculative_num_draft_tokens=case["num_draft_tokens"]),
            "get_context": lambda: NS(override=override)}


def pool_figures(case: dict) -> dict:
    import sglang.srt.mem_cache.kv_cache_configurator as kvcm
    from sglang.srt.configs.hybrid_arch import mambaish_config
    from sglang.srt.configs.model_config import ModelConfig
    import sglang.srt.model_executor.pool_configurator as pool_configurator
    from sglang.srt.model_executor.pool_configurator import DefaultPoolConfigurator
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    tp = case["tp"]
    _install_parallel(tp)  # before the model's config is read: its mamba state shapes split over the ranks
    for name, function in _context(case).items():
        setattr(kvcm, name, function)
    parallel = _parallel(tp)
    parallel.world_group = NS(cpu_group=None)  # get_available_gpu_memory's, answered below without it
    kvcm.get_parallel = lambda: parallel
    kvcm.get_available_gpu_memory = lambda *args, **kwargs: case["loaded_gib"]

    mc = ModelConfig(case["target"], trust_remote_code=False, context_length=case["context_length"])
    mamba = mambaish_config(mc)
    spec = SpeculativeAlgorithm.from_string(case["algorithm"])

    class Configurator(kvcm.KVCacheConfigurator):
        def fused_entry_bytes(self, sub_pool_name):
            return None  # no fused draft pool (the default layout)

    kvc = Configurator.__new__(Configurator)
    for key, value in dict(device="cuda", gpu_id=0, model_config=mc, mambaish_config=mamba,
                           post_capture_kv_active=False, pp_size=1, attn_dp_size=1, spec_algorithm=spec,
                           hybrid_gdn_config=mamba, hybrid_kda_config=None,
                           extra_mamba_cache_bytes_per_req=0).items():
        setattr(kvc, key, value)
    # The cells as tests/sglang_kv_cell.py computes them, then DefaultPoolConfigurator.__init__'s sum for DFlash.
    cell = cell_figures({"path": case["target"], "tp": tp, "kv_cache_dtype": case["kv_cache_dtype"]})["cell_size"]
    if case["draft"]:
        draft = ModelConfig(case["draft"], trust_remote_code=False, is_draft_model=True)
        draft_cell = cell_figures({"path": case["draft"], "tp": tp, "kv_cache_dtype": case["kv_cache_dtype"],
                                   "draft": True})["cell_size"]
        cell = dflash_utils_function("scale_kv_cell_size_per_token_for_dflash")(
            target_cell_size_per_token=cell, target_num_layers=len(mamba.full_attention_layer_ids) if mamba
            else mc.num_hidden_layers, draft_num_layers=draft.num_hidden_layers, draft_cell_size_per_token=draft_cell)
    pool = DefaultPoolConfigurator.__new__(DefaultPoolConfigurator)
    pool._cell_size, pool._fixed_overhead_bytes = cell, 0
    pool_configurator.create_memory_pool_configurator = lambda _kvc: pool  # the default layout's, built above
    config = kvc._resolve_memory_pool_config(case["pre_gib"])
    # managers/tp_worker.py: the longest request, from the model's context and the pool.
    max_req_len = min(mc.context_len - 1, config.max_total_num_tokens - 1)
    return {"max_total_num_tokens": int(config.max_total_num_tokens),
            "max_running_requests": int(config.max_running_requests), "max_req_len": max_req_len,
            "context_len": mc.context_len}


if __name__ == "__main__":
    answer(pool_figures)
