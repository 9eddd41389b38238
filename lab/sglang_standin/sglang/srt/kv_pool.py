"""LAB STAND-IN for a scheduler's startup once the weights are loaded (0.5.23 model_executor/model_runner.py,
managers/tp_worker.py): its pool (`max_total_num_tokens`), its cap on running requests, its longest request,
and the refusals on the way, which end the server as the real one ends.

The decisions are the release's own code: _resolve_memory_pool_config and everything it calls
(_profile_available_bytes, _handle_max_mamba_cache, _calculate_mamba_ratio, config_from_budget,
resolve_max_num_reqs), copied verbatim into srt/mem_cache/ and srt/model_executor/ here and held to the
wheel's text and behaviour by tests/lab_code/test_sglang_kv_pool.py. What this module adds is what a
stand-in that loads nothing onto a GPU must hand that code, each checked against the wheel's functions in
the same test:

1. The free memory before the weights load, the smallest over the ranks (distributed/bootstrap.py
   measure_pre_model_load_memory): the GPU's memory.total from nvidia-smi (on a lab host the GPU stand-in's
   profile, the cards' real memory). It holds no CUDA context, which a real rank has resident by then
   (~0.5 GiB): the one step where the stand-in knows less than the engine.
2. The free memory once the weights are loaded (get_available_gpu_memory): the first figure less the sizes of
   the *.safetensors files of --model-path and of the drafter's path, split evenly over the TP ranks: what
   the real loader puts on each rank's GPU, bar the few tensors it replicates.
3. The bytes a token takes (model_executor/pool_configurator.py DefaultPoolConfigurator: the target's cell,
   _compute_cell_size, plus a DFlash drafter's, dflash_draft_cell_size_per_token) and a hybrid model's
   recurrent state a request (configs/mamba_utils.py mamba_cache_per_req).

The post-capture re-sizing (model_runner_components/kv_pool_runtime.py) runs only with
SGLANG_ENABLE_POST_CAPTURE_KV_SIZING, off by default (environ.py), and never for MLA: not modelled.
"""

from dataclasses import dataclass
from pathlib import Path

from sglang.srt.configs.model_config import ModelConfig
from sglang.srt.mem_cache.kv_cache_configurator import KVCacheConfigurator
from sglang.srt.mem_cache.kv_cache_dtype import configure_kv_cache_dtype
from sglang.srt.model_executor.model_runner_components.layer_setup import ModelLayerInfo
from sglang.srt.model_executor.model_runner_components.spec_aux_hidden_state import SpecAuxHiddenStateConfig
from sglang.srt.runtime_context import SpawnRanks, get_device, publish
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
from sglang.srt.utils import read_knobs

GIB = 1 << 30


def weight_bytes(*model_dirs: str | None) -> int:
    """The *.safetensors files' sizes of the given model folders (what the loader puts on the GPUs)."""
    return sum(f.stat().st_size for d in model_dirs if d for f in Path(d).glob("*.safetensors"))


@dataclass(frozen=True)
class Startup:
    """What a scheduler reports once its pool is sized (managers/scheduler.py get_init_info, tp_worker.py)."""

    max_total_num_tokens: int
    max_running_requests: int
    max_req_len: int
    max_req_input_len: int
    context_len: int


def startup(args, card_mib: float):
    """The scheduler's sizing for resolved server `args` on a card of `card_mib` MiB, constructed as
    model_executor/model_runner.py constructs it and run as the release runs it
    (KVCacheConfigurator._resolve_memory_pool_config, srt/mem_cache/kv_cache_configurator.py here); raises
    what the release raises there, its assertions included. Returns what the scheduler starts with."""
    if args.mem_fraction_static is None:  # the real one picks it from the card (arg_groups/memory_hook.py)
        raise ValueError("the lab stand-in does not model SGLang's choice of --mem-fraction-static: set it")
    publish(args, role="scheduler", ranks=SpawnRanks(world_rank=0, dp_rank=None, gpu_id=0))
    # The sized_as knob: the checkpoints to size for in place of the lab hub's tiny ones (their folders'
    # config.json and *.safetensors sizes), so that a lab server meets the real model's pool and caps.
    sized_as = read_knobs().get("sized_as") or {}
    target = ModelConfig.from_server_args(args, model_path=sized_as.get("target"))
    draft = ModelConfig.from_server_args(args, model_path=sized_as.get("drafter", args.speculative_draft_model_path),
                                         is_draft_model=True) if args.speculative_draft_model_path else None
    spec = SpeculativeAlgorithm.from_string(args.speculative_algorithm)
    pre = card_mib / 1024
    get_device().free_gb = pre - weight_bytes(target.model_path, draft.model_path if draft else None) \
        / args.tp_size / GIB
    _, kv_dtype = configure_kv_cache_dtype(
        server_args_kv_cache_dtype=args.kv_cache_dtype, model=None, model_dtype=target.dtype,
        is_draft_worker=False, is_dflash=False, speculative_draft_attention_backend=None)
    layers = target.num_hidden_layers
    kvc = KVCacheConfigurator(
        device="cuda", gpu_id=0, attn_dp_size=1, pp_size=1, model_config=target, kv_cache_dtype=kv_dtype,
        page_size=args.page_size, spec_algorithm=spec, is_draft_worker=False, post_capture_kv_active=False,
        spec_aux_config=SpecAuxHiddenStateConfig(
            dflash_draft_num_layers=draft.num_hidden_layers if draft and spec.is_dflash_family() else None,
            draft_model_config=draft),
        is_hybrid_swa=False, layer_info=ModelLayerInfo(start_layer=0, end_layer=layers, num_effective_layers=layers),
        kv_cache_dtype_str=args.kv_cache_dtype)
    config = kvc._resolve_memory_pool_config(pre)
    tokens = kvc.logical_token_capacity(max_total_num_tokens=config.max_total_num_tokens)
    # managers/tp_worker.py: the validation after the pools, and the longest request (get_worker_info).
    assert config.max_running_requests > 0, "max_running_request is zero"
    max_req_len = min(target.context_len - 1, tokens - 1)
    assert max_req_len > 0, "Memory pool size is too small"
    return Startup(tokens, config.max_running_requests, max_req_len, max_req_len - 5, target.context_len)
