"""Run in the real-SGLang env (tests/sglang_real.py, startup_with_real_sglang): SGLang 0.5.23's own startup,
from the command line to the figures its scheduler starts with, up to where it would need a GPU.

Per case {"argv", "env", "gpu": {name, compute_capability, count, memory_mib}, "pre_gib": the free memory
before the weights load, "loaded_gib": the free memory once they (target and drafter) have}, in a fork of one
warmed process (tests/sglang_real_gpu.py presents the class's GPU, as for the deploy's resolution check):
- the server arguments: prepare_server_args, ServerArgs.resolve_once and check_server_args (the post-init hooks);
- the scheduler's config: runtime_context.publish(server_args, role="scheduler"), as run_scheduler_process does;
- the model configs: ModelConfig.from_server_args for the target and the drafter (get_context_length, the
  --context-length override and its check);
- the pool: a KVCacheConfigurator (mem_cache/kv_cache_configurator.py), with the EAGLE family's draft layers as
  spec_aux_hidden_state.py's _resolve_eagle_aux_hidden_state finds them, whose _resolve_memory_pool_config steps
  run as the wheel has them: _profile_available_bytes (the slack, the multimodal reservation, the mamba state
  through _handle_max_mamba_cache and _calculate_mamba_ratio), config_from_budget (DefaultPoolConfigurator's
  cell, a DFlash drafter's through resolve_dflash_draft_cell_size) and resolve_max_num_reqs;
- the longest request: min(context_len - 1, tokens - 1), tp_worker.py's max_req_len (and its assertion).
What is stood in for, and why: get_available_gpu_memory answers "loaded_gib" (no GPU here); the runtime's
parallel placement is one rank of one TP group (no torch.distributed); the model object is absent (pool sizing
reads only its quantization config, none for these checkpoints); srt/speculative/dflash_utils.py imports
the scheduler (einops and more this env does not install), so its two sizing functions are taken out of its
text (tests/sglang_kv_cell.py) and served as that module. An assertion or exception anywhere is the case's
{"error": "<type>: <the engine's message>"}. Answers @@RESULT@@{"cases": [...]}.
"""

import gc
import json
import os
import sys
import types

from sglang_kv_cell import dflash_utils_function
from sglang_real_gpu import run_case  # imports SGLang's hooks while no GPU is visible, as the engine must be


def _serve_dflash_utils() -> None:
    module = types.ModuleType("sglang.srt.speculative.dflash_utils")
    for name in ("dflash_draft_cell_size_per_token", "scale_kv_cell_size_per_token_for_dflash"):
        setattr(module, name, dflash_utils_function(name))
    sys.modules[module.__name__] = module


_serve_dflash_utils()
# Imported before the fork presents a GPU: with one visible at import time they load CUDA kernel libraries.
import sglang.srt.mem_cache.kv_cache_configurator as kvcm  # noqa: E402
import sglang.srt.model_executor.pool_configurator  # noqa: E402,F401
from sglang.srt.configs.model_config import AttentionArch, ModelConfig  # noqa: E402
from sglang.srt.mem_cache.kv_cache_dtype import configure_kv_cache_dtype  # noqa: E402
from sglang.srt.model_executor.model_runner_components.layer_setup import ModelLayerInfo  # noqa: E402
from sglang.srt.model_executor.model_runner_components.spec_aux_hidden_state import (  # noqa: E402
    SpecAuxHiddenStateConfig, _resolve_eagle_aux_hidden_state)
from sglang.srt.runtime_context import SpawnRanks, get_parallel, publish  # noqa: E402
from sglang.srt.server_args import prepare_server_args  # noqa: E402
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm  # noqa: E402

GIB = 1 << 30


def startup(case: dict) -> dict:
    server_args = prepare_server_args(case["argv"])
    server_args.resolve_once()
    server_args.check_server_args()
    publish(server_args, role="scheduler", ranks=SpawnRanks(world_rank=0, dp_rank=None, gpu_id=0))
    resolved = server_args.resolved_dict()
    target = ModelConfig.from_server_args(server_args)
    draft_path = resolved.get("speculative_draft_model_path")
    draft = ModelConfig.from_server_args(server_args, model_path=draft_path, is_draft_model=True) if draft_path \
        else None
    spec = SpeculativeAlgorithm.from_string(resolved.get("speculative_algorithm"))
    _, kv_dtype = configure_kv_cache_dtype(
        server_args_kv_cache_dtype=resolved["kv_cache_dtype"], model=None, model_dtype=target.dtype,
        is_draft_worker=False, is_dflash=False, speculative_draft_attention_backend=None)
    layers = target.num_hidden_layers
    kvcm.get_available_gpu_memory = lambda *args, **kwargs: case["loaded_gib"]
    get_parallel().override_permanently(world_group=types.SimpleNamespace(cpu_group=None))

    class Configurator(kvcm.KVCacheConfigurator):
        def fused_entry_bytes(self, sub_pool_name):
            return None  # no fused draft pool: the default layout

    aux = SpecAuxHiddenStateConfig(
        dflash_draft_num_layers=draft.num_hidden_layers if draft and spec.is_dflash_family() else None,
        draft_model_config=draft)
    if spec.is_eagle():  # the EAGLE family's draft layers, as model_runner.py resolves them
        aux = SpecAuxHiddenStateConfig()
        _resolve_eagle_aux_hidden_state(config=aux, server_args=server_args, model_config=target, spec_algorithm=spec,
                                        is_draft_worker=False)
    kvc = Configurator(
        device="cuda", gpu_id=0, attn_dp_size=1, pp_size=1, pp_group=None, model=None, model_config=target,
        server_args=server_args, kv_cache_dtype=kv_dtype, model_dtype=target.dtype,
        page_size=resolved["page_size"], sliding_window_size=None, spec_algorithm=spec, is_draft_worker=False,
        post_capture_kv_active=False,
        spec_aux_config=aux,
        is_hybrid_swa=False, is_hybrid_swa_compress=False, use_mla_backend=target.attention_arch == AttentionArch.MLA,
        layer_info=ModelLayerInfo(start_layer=0, end_layer=layers, num_effective_layers=layers), forward_stream=None,
        req_to_token_pool=None, token_to_kv_pool_allocator=None, memory_pool_config=None,
        kv_cache_dtype_str=resolved["kv_cache_dtype"])
    config = kvc._resolve_memory_pool_config(case["pre_gib"])  # in GiB, as get_available_gpu_memory answers
    tokens = kvc.logical_token_capacity(max_total_num_tokens=config.max_total_num_tokens)
    max_req_len = min(target.context_len - 1, tokens - 1)
    assert max_req_len > 0, "Memory pool size is too small"  # tp_worker.py's
    schedule = kvcm.get_schedule()
    return {"max_total_num_tokens": int(tokens), "max_running_requests": int(config.max_running_requests),
            "max_req_len": int(max_req_len), "context_len": int(target.context_len),
            "mamba_ratio": kvc._calculate_mamba_ratio() if kvc.mambaish_config else None,
            "max_mamba_cache_size": schedule.max_mamba_cache_size if kvc.mambaish_config else None,
            "resolved": {key: resolved.get(key) for key in (
                "mamba_radix_cache_strategy", "disable_overlap_schedule", "disable_radix_cache",
                "max_running_requests", "speculative_draft_attention_backend", "kv_cache_dtype", "page_size")}}


def _one(case: dict) -> dict:
    try:
        return startup(case)
    except BaseException as exc:  # noqa: BLE001 - the engine's refusal is the answer
        return {"error": f"{type(exc).__name__}: {exc}".splitlines()[0]}


def main() -> None:
    os.environ["HF_HUB_OFFLINE"] = "1"  # as the host check runs: model folders only, no hub
    # The engine's _profile_available_bytes runs gc.collect(), which in each fork would walk the warmed
    # process's whole heap (torch's and SGLang's modules: ~1.7 s a case); frozen, it walks only the case's.
    gc.freeze()
    results = []
    for case in json.load(sys.stdin)["cases"]:
        results.append(run_case(lambda _argv, case=case: _one(case), case))
    print("@@RESULT@@" + json.dumps({"cases": results}, default=repr), flush=True)


if __name__ == "__main__":
    main()
