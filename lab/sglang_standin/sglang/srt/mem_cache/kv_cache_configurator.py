"""LAB STAND-IN for SGLang 0.5.23's KV-cache configurator (srt/mem_cache/kv_cache_configurator.py): how a
scheduler sizes its pool and caps its requests once the weights are loaded.

Why copies: the real module imports torch's CUDA build, the memory pools and the kernels, none of which a
lab host has (its torch is the lab's stand-in), so it cannot be imported there; and a re-reading of its
arithmetic is what let the lab serve 48 requests where the engine serves 4. So the functions that decide
are the release's own text, copied verbatim (each `def` below between the COPIED markers), and
tests/lab_code/test_sglang_kv_pool.py holds every one of them to the wheel's source (their syntax trees
must be equal) and the whole against the wheel's own functions run in the real-SGLang env. What is the
stand-in's own is only what those functions are handed: the config bags (srt/runtime_context.py), the
model's config (srt/configs/model_config.py), the cell a token takes (srt/model_executor/pool_configurator.py)
and the free memory the load left (get_available_gpu_memory: the device bag, which srt/kv_pool.py fills).
The branches a specfleet layout never takes (pipeline stages, post-capture sizing, PD prefill) stay as the
release wrote them; the names they alone would reach raise rather than answer.
"""

from __future__ import annotations

import gc
import logging
import math
from typing import Optional

from sglang.srt.configs.hybrid_arch import mambaish_config
from sglang.srt.environ import envs
from sglang.srt.mem_cache.allocation_sizing import get_mamba_tracking_slots
from sglang.srt.runtime_context import (
    get_context,
    get_device,
    get_disagg,
    get_exec,
    get_memory,
    get_mm,
    get_parallel,
    get_schedule,
    get_spec,
)

logger = logging.getLogger(__name__)
_is_npu = False  # utils/common.py is_npu(): a lab host has no Ascend NPU


class Backend:
    """model_executor/cuda_graph_config.py Backend, the member the copies compare with."""

    FULL = "full"


def get_available_gpu_memory(device, gpu_id, distributed=False, empty_cache=True, cpu_group=None) -> float:
    """utils/common.py: the rank's free memory in GB, here what the stand-in's model load left."""
    return get_device().free_gb


def _unmodelled(*_args, **_kwargs):
    raise NotImplementedError("the lab stand-in does not model pipeline stages or post-capture KV sizing")


get_pp_indices = pre_capture_activation_reserve_mb = get_device_memory_capacity = _unmodelled


class _Torch:
    """The one torch use of the copies (_apply_token_constraints' PP all-reduce), never reached at PP 1."""

    tensor = distributed = _unmodelled


torch = _Torch()

# ---- COPIED from the 0.5.23 wheel, srt/mem_cache/kv_cache_configurator.py (module level) ----
def _pd_prefill_skips_mamba_spec_state() -> bool:
    # Prefill never runs TARGET_VERIFY, so the plain hybrid req pool skips the
    # verify-only snapshots; role-switch and unified-memory pools still allocate them.
    disagg = get_disagg()
    return (
        disagg.disaggregation_mode == "prefill"
        and not disagg.enable_pd_role_switch
        and not get_memory().enable_unified_memory
        and not _is_npu
    )


def mm_runtime_reservation_gb(
    *, is_multimodal: bool, mm_feature_transport: Optional[str]
) -> float:
    """Multimodal GPU memory allocated only after the KV pool is sized
    (mm embedding cache + GPU feature-transport pools); reserve it out of
    the KV budget so it doesn't have to fit in the runtime slack."""
    if not is_multimodal:
        return 0.0
    reserved_mb = envs.SGLANG_VLM_CACHE_SIZE_MB.get()
    if mm_feature_transport in ("cuda_ipc", "cuda_vmm"):
        reserved_mb += envs.SGLANG_MM_FEATURE_CACHE_MB.get()
    if reserved_mb > 0:
        logger.info(
            "Reserving %.2f GB of the KV budget for post-sizing multimodal "
            "allocations (feature-transport pools + embedding cache).",
            reserved_mb / 1024,
        )
    return reserved_mb / 1024


MAMBA_CACHE_SIZE_MAX_RUNNING_REQUESTS_RATIO = 3
MAMBA_CACHE_BASE_RATIO_DROP_ON_SKIP = 1
MAMBA_CACHE_V2_ADDITIONAL_RATIO_NO_BUFFER = 1
# ---- end of COPIED ----


class KVCacheConfigurator:
    """The configurator a scheduler builds (model_executor/model_runner.py init_kv_cache_configurator), taking
    the release's fields; those the copied methods read are kept, a hybrid model's state described as its
    __post_init__ describes it (configs/hybrid_arch.py mambaish_config)."""

    def __init__(self, *, device: str, gpu_id: int, attn_dp_size: int, pp_size: int, model_config, kv_cache_dtype,
                 page_size: int, spec_algorithm, is_draft_worker: bool, post_capture_kv_active: bool,
                 spec_aux_config, is_hybrid_swa: bool, layer_info, kv_cache_dtype_str: str | None = None,
                 **fields_not_read):
        self.device, self.gpu_id, self.attn_dp_size, self.pp_size = device, gpu_id, attn_dp_size, pp_size
        self.model_config, self.kv_cache_dtype, self.kv_cache_dtype_str = model_config, kv_cache_dtype, kv_cache_dtype_str
        self.page_size, self.spec_algorithm, self.is_draft_worker = page_size, spec_algorithm, is_draft_worker
        self.post_capture_kv_active, self.spec_aux_config = post_capture_kv_active, spec_aux_config
        self.is_hybrid_swa, self.layer_info = is_hybrid_swa, layer_info
        self.mambaish_config = self.hybrid_gdn_config = mambaish_config(model_config)  # Gated DeltaNet (Qwen3.5/3.6)
        self.hybrid_kda_config = None
        self.extra_mamba_cache_bytes_per_req = 0

    def fused_entry_bytes(self, sub_pool_name):
        return None  # no fused draft pool (the default layout)

    # ---- COPIED from the 0.5.23 wheel, srt/mem_cache/kv_cache_configurator.py (KVCacheConfigurator) ----
    def _profile_available_bytes(self, pre_model_load_memory: int) -> int:
        # KV pool budget = currently-free GPU memory minus the non-static runtime
        # slack (pre_model_load_memory * (1 - mem_fraction_static)). Whatever is
        # already resident (model weights, etc.) is thus charged against it.
        # Weight-loading temporaries can still be referenced at this point, and
        # empty_cache() (which get_available_gpu_memory already calls) cannot
        # reclaim referenced blocks. Without collecting first, the KV budget is
        # measured against an understated free-memory figure and the pool can be
        # sized orders of magnitude too small while GPU memory sits idle.
        gc.collect()
        available_gpu_memory = get_available_gpu_memory(
            self.device,
            self.gpu_id,
            distributed=get_parallel().launch_world_size > 1,
            cpu_group=get_parallel().world_group.cpu_group,
        )

        slack_gb = pre_model_load_memory * (1 - get_schedule().mem_fraction_static)
        # Every prefill batch fits a captured bucket when batches are capped at the
        # request slots; the exemption also needs an explicit Mamba size: a larger
        # rest_memory would otherwise auto-size a bigger physical Mamba pool below.
        prefill_max_requests = get_schedule().prefill_max_requests
        request_slots = get_exec().graph.cuda_graph_config.prefill.full_prefill_max_req
        capped_full_prefill_role = (
            get_disagg().disaggregation_mode == "prefill"
            and get_exec().graph.cuda_graph_config.prefill.backend == Backend.FULL
            and get_schedule().max_mamba_cache_size is not None
            and prefill_max_requests is not None
            and request_slots is not None
            and prefill_max_requests <= request_slots
        )
        if (
            self.mambaish_config is not None
            and self.post_capture_kv_active
            and not capped_full_prefill_role
        ):
            # Mamba state is a fixed pre-capture allocation, so it can't ride the ~0 post-capture slack.
            slack_gb = max(
                slack_gb,
                pre_capture_activation_reserve_mb(
                    get_device_memory_capacity(self.device)
                )
                / 1024,
            )
        mm_reservation_gb = mm_runtime_reservation_gb(
            is_multimodal=self.model_config.is_multimodal,
            mm_feature_transport=get_mm().mm_feature_transport,
        )
        rest_memory = available_gpu_memory - slack_gb - mm_reservation_gb
        if self.mambaish_config is not None:
            rest_memory = self._handle_max_mamba_cache(rest_memory)

        # Loaded weights (target + draft) can exceed the static budget
        if rest_memory <= 0:
            minimum_mem_fraction_static = (
                1 - available_gpu_memory / pre_model_load_memory
            )
            suggested_mem_fraction_static = (
                math.ceil(minimum_mem_fraction_static * 1000) / 1000
            )
            raise ValueError(
                f"Loaded weights leave no GPU memory for the KV cache under "
                f"--mem-fraction-static={get_schedule().mem_fraction_static}. "
                f"Raise --mem-fraction-static above "
                f"{suggested_mem_fraction_static:.3f} "
                f"(minimum viable = 1 - available/pre = "
                f"{minimum_mem_fraction_static:.4f}). If using speculative "
                f"decoding, draft weights are now counted."
            )

        return int(rest_memory * (1 << 30))  # return in bytes

    def _calculate_mamba_ratio(self) -> int:
        if get_memory().disable_radix_cache:
            return 1

        skip_decode_lock = envs.SGLANG_OPT_MAMBA_SKIP_DECODE_LOCK.get()
        base = MAMBA_CACHE_SIZE_MAX_RUNNING_REQUESTS_RATIO - (
            MAMBA_CACHE_BASE_RATIO_DROP_ON_SKIP if skip_decode_lock else 0
        )

        additional_ratio = 0
        if get_exec().mamba.enable_mamba_extra_buffer:
            if get_schedule().disable_overlap_schedule:
                assert not get_exec().mamba.enable_mamba_extra_buffer_lazy, (
                    "Lazy extra buffer requires overlap schedule (--disable-overlap-schedule is incompatible)"
                )
            additional_ratio = get_mamba_tracking_slots(
                extra_buffer=True,
                overlap=not get_schedule().disable_overlap_schedule,
                lazy=get_exec().mamba.enable_mamba_extra_buffer_lazy,
            )
        elif skip_decode_lock:
            # no_buffer under skip: add the base drop back so effective stays 3,
            # the prefill->decode peak needs ~3 slots/req and this leaf-only mode
            # has no ping-pong to absorb it.
            additional_ratio = MAMBA_CACHE_V2_ADDITIONAL_RATIO_NO_BUFFER

        return base + additional_ratio

    def _apply_token_constraints(self, token_capacity: int) -> int:
        """Apply external constraints to token capacity: user cap, PP sync.

        Page alignment is handled by the configurator, not here.
        If constraints change the value, the configurator re-runs and re-aligns.
        """
        user_limit = get_schedule().max_total_tokens

        # Apply user-specified upper bound
        if user_limit is not None:
            if user_limit > token_capacity:
                logging.warning(
                    f"max_total_tokens={user_limit} is larger than the profiled value "
                    f"{token_capacity}. Use the profiled value instead."
                )
            token_capacity = min(token_capacity, user_limit)

        # Sync across PP ranks (each may have different layer counts)
        if get_parallel().pp_size > 1:
            tensor = torch.tensor(token_capacity, dtype=torch.int64)
            torch.distributed.all_reduce(
                tensor,
                op=torch.distributed.ReduceOp.MIN,
                group=get_parallel().world_group.cpu_group,
            )
            token_capacity = tensor.item()

        return token_capacity

    def resolve_max_num_reqs(self, token_capacity: int) -> int:
        """Compute max concurrent requests (per dp worker) from the finalized
        token capacity."""
        # Estimate pool size (used as upper bound when user specifies max_running_requests)
        estimated = int(token_capacity / self.model_config.context_len * 512)
        estimated = max(min(estimated, 4096), 2048)

        max_num_reqs = get_schedule().max_running_requests
        if max_num_reqs is not None:
            requested_per_worker = max(1, max_num_reqs // self.attn_dp_size)
            max_num_reqs = min(requested_per_worker, token_capacity // 2)
        else:
            requested_per_worker = None
            max_num_reqs = min(estimated, token_capacity // 2)

        capped_by_mamba = False
        if self.mambaish_config is not None:
            ratio = self._calculate_mamba_ratio()
            mamba_cap = get_schedule().max_mamba_cache_size // ratio
            if mamba_cap < max_num_reqs:
                capped_by_mamba = True
                logger.warning(
                    "max_running_requests is capped to %d by the mamba state "
                    "cache (max_mamba_cache_size=%d, %d state slots per "
                    "request). To raise it: increase --mamba-full-memory-ratio "
                    "or --max-mamba-cache-size, or halve the state size with "
                    "--mamba-ssm-dtype bfloat16.",
                    mamba_cap,
                    get_schedule().max_mamba_cache_size,
                    ratio,
                )
            max_num_reqs = min(max_num_reqs, mamba_cap)

            if max_num_reqs <= 0:
                raise RuntimeError(
                    f"Hybrid (mamba/linear-attention) state cache is too small to serve "
                    f"any requests. max_mamba_cache_size={get_schedule().max_mamba_cache_size}, "
                    f"mamba_ratio={ratio}, resulting max_num_reqs={max_num_reqs}. "
                    f"Try: (1) reduce --max-running-requests, "
                    f"(2) increase --mem-fraction-static, or "
                    f"(3) use GPUs with more memory."
                )
        if (
            requested_per_worker is not None
            and max_num_reqs < requested_per_worker
            and not capped_by_mamba
        ):
            logger.warning(
                "max_running_requests was reduced from the requested %d to %d "
                "(per dp worker) due to the available KV cache capacity.",
                requested_per_worker,
                max_num_reqs,
            )
        return max_num_reqs

    def _resolve_memory_pool_config(
        self, pre_model_load_memory: int
    ) -> MemoryPoolConfig:
        """Profile GPU memory and resolve all pool parameters into a config."""
        from sglang.srt.model_executor.pool_configurator import (
            create_memory_pool_configurator,
        )

        available_bytes = self._profile_available_bytes(pre_model_load_memory)
        config = self.config_from_budget(available_bytes)
        config.max_running_requests = self.resolve_max_num_reqs(
            config.max_total_num_tokens
        )
        configurator = create_memory_pool_configurator(self)
        config = configurator.finalize_with_max_running_requests(config)
        config.mem_fraction_static = get_schedule().mem_fraction_static
        return config

    def config_from_budget(
        self, budget_bytes: int, *, cap_tokens: Optional[int] = None
    ) -> MemoryPoolConfig:
        """Turn a KV byte budget into a pool config via the configurator, re-applying
        the external token constraints (user cap, page alignment, PP sync) and the
        optional ``cap_tokens`` clamp."""
        # Local import avoids a pool_configurator import cycle.
        from sglang.srt.model_executor.pool_configurator import (
            create_memory_pool_configurator,
        )

        configurator = create_memory_pool_configurator(self)
        config = configurator.calculate_pool_sizes(
            budget_bytes, get_schedule().page_size
        )
        if get_memory().enable_unified_memory:
            # Floor-align to 4096 B: the factories `.view()` the whole uint8
            # buffer as the KV/state dtype, so the total must be a dtype-size
            # multiple and a profiled budget is not. Flooring never overcommits.
            config.unified_total_bytes = budget_bytes - (budget_bytes % 4096)
        max_tokens = self._apply_token_constraints(config.max_total_num_tokens)
        if cap_tokens is not None:
            max_tokens = min(max_tokens, cap_tokens)
        # calculate_pool_sizes_from_max_tokens takes a token count, not a byte
        # budget; it cannot re-subtract the fixed pools, so capacity must not rise.
        assert max_tokens <= config.max_total_num_tokens, (
            f"token constraints must not raise capacity: {max_tokens} > "
            f"{config.max_total_num_tokens}"
        )
        if max_tokens != config.max_total_num_tokens:
            # Re-derive the capped budget: SWA carries unified_memory_pool_bytes;
            # Mamba factories fall back to token-count sizing without unified_total_bytes.
            config = configurator.calculate_pool_sizes_from_max_tokens(
                max_tokens, get_schedule().page_size
            )
        return config

    def _handle_max_mamba_cache(self, total_rest_memory):
        config = self.mambaish_config
        assert config is not None

        # mamba_cache_per_req covers every mamba layer, but under PP a rank only
        # allocates its own [start_layer, end_layer) slice. Charge the largest
        # per-stage share so every rank derives the same pool without a collective.
        all_mamba_layers = config.mamba2_cache_params.layers
        if self.pp_size > 1 and all_mamba_layers:
            max_stage_mamba_layers = max(
                sum(1 for i in all_mamba_layers if start <= i < end)
                for start, end in (
                    get_pp_indices(
                        self.model_config.num_hidden_layers,
                        rank,
                        self.pp_size,
                    )
                    for rank in range(self.pp_size)
                )
            )
        else:
            max_stage_mamba_layers = len(all_mamba_layers)
        pp_layer_scale = max_stage_mamba_layers / max(len(all_mamba_layers), 1)
        # A fused draft state block widens every state slot: price the entry
        # the unified factory carves out (host + draft + pad), not the host's.
        fused_state_entry = self.fused_entry_bytes("mamba")
        per_req = (
            config.mamba2_cache_params.mamba_cache_per_req
            if fused_state_entry is None
            else fused_state_entry
        )
        stage_per_req = int(per_req * pp_layer_scale)

        has_spec_dec = not self.spec_algorithm.is_none()
        # ReplaySSM drops the per-step intermediate_ssm scratch, so its mamba budget
        # no longer reserves the (1 + D/ratio) intermediate factor -- the whole
        # budget goes to persistent slots (K sized like non-spec), which is how the
        # freed ~9GB turns into higher max_running.
        # The ring is not part of mamba_cache_per_req. GDN replay is fixed-size
        # request scratch; KDA replay remains attached to each mamba slot.
        replayssm_active = get_exec().mamba.enable_linear_replayssm_spec and (
            self.hybrid_gdn_config is not None or self.hybrid_kda_config is not None
        )
        if replayssm_active:
            record_len = get_exec().mamba.linear_replayssm_cache_len
            replayssm_ring_per_req = (
                config.mamba2_cache_params.replayssm_ring_bytes_per_req(
                    record_len=record_len
                )
            )
        else:
            replayssm_ring_per_req = 0
        replayssm_ring_per_req = int(replayssm_ring_per_req * pp_layer_scale)
        if replayssm_active and self.hybrid_kda_config is None:
            replay_req_slots = (
                max(1, get_schedule().max_running_requests // self.attn_dp_size) + 1
            )
            replayssm_fixed_bytes = replayssm_ring_per_req * replay_req_slots
            replayssm_ring_per_slot = 0
        else:
            replayssm_fixed_bytes = 0
            replayssm_ring_per_slot = replayssm_ring_per_req
        extra_per_slot = replayssm_ring_per_slot + int(
            self.extra_mamba_cache_bytes_per_req * pp_layer_scale
        )
        reserves_spec_state = (
            has_spec_dec
            and not replayssm_active
            and not _pd_prefill_skips_mamba_spec_state()
        )
        if has_spec_dec:
            assert get_spec().speculative_num_draft_tokens is not None
            assert get_schedule().max_running_requests is not None

        if get_schedule().max_mamba_cache_size is not None:
            # Use explicitly set max_mamba_cache_size
            get_context().override(
                "mamba_pool.per_dp_shard",
                max_mamba_cache_size=get_schedule().max_mamba_cache_size
                // self.attn_dp_size,
            )
            # Reserve intermediate memory based on capped max_num_reqs (+1: the
            # pool's padding slot, see memory_pool.py). Skipped under replayssm
            # and on PD prefill (no intermediate_ssm allocated).
            if reserves_spec_state:
                ratio = self._calculate_mamba_ratio()
                capped_reqs = min(
                    max(1, get_schedule().max_running_requests // self.attn_dp_size),
                    get_schedule().max_mamba_cache_size // ratio,
                )
                intermediate_size = (
                    stage_per_req
                    * (capped_reqs + 1)
                    * get_spec().speculative_num_draft_tokens
                )
                total_rest_memory = total_rest_memory - (intermediate_size / (1 << 30))
        elif (
            get_memory().disable_radix_cache
            and get_schedule().max_running_requests is not None
        ):
            # Use explicitly set max_running_requests when radix cache is disabled
            get_context().override(
                "mamba_pool.from_max_running_requests",
                max_mamba_cache_size=max(
                    1, get_schedule().max_running_requests // self.attn_dp_size
                ),
            )
            # Reserve intermediate memory based on capped max_num_reqs (+1: the
            # pool's padding slot). Skipped under replayssm and on PD prefill.
            if reserves_spec_state:
                intermediate_size = (
                    stage_per_req
                    * (get_schedule().max_mamba_cache_size + 1)
                    * get_spec().speculative_num_draft_tokens
                )
                total_rest_memory = total_rest_memory - (intermediate_size / (1 << 30))
        else:
            # Use ratio-based calculation to auto-fit available memory
            assert stage_per_req > 0
            per_req = stage_per_req

            # Solve jointly for max_mamba_cache_size (K), including the pool's
            # +1 padding slot on both buffers (see memory_pool.py).
            mamba_budget = (
                total_rest_memory
                * get_schedule().mamba_full_memory_ratio
                / (1 + get_schedule().mamba_full_memory_ratio)
            )
            mamba_budget_bytes = mamba_budget * (1 << 30)

            if reserves_spec_state:
                ratio = self._calculate_mamba_ratio()
                D = get_spec().speculative_num_draft_tokens
                # Joint solve: main_state + intermediate = mamba_budget
                get_context().override(
                    "mamba_pool.memory_budget_spec",
                    max_mamba_cache_size=int(
                        (mamba_budget_bytes - per_req * (1 + D) - extra_per_slot)
                        // (per_req * (1 + D / ratio) + extra_per_slot)
                    ),
                )
                # Intermediate memory is included in mamba_budget, subtract it
                # so the return value only has main_state subtracted from total
                capped_reqs = min(
                    max(1, get_schedule().max_running_requests // self.attn_dp_size),
                    get_schedule().max_mamba_cache_size // ratio,
                )
                intermediate_size = per_req * (capped_reqs + 1) * D
                total_rest_memory = total_rest_memory - (intermediate_size / (1 << 30))
            else:
                per_slot = per_req + extra_per_slot
                get_context().override(
                    "mamba_pool.memory_budget",
                    max_mamba_cache_size=int(
                        (mamba_budget_bytes - replayssm_fixed_bytes - per_slot)
                        // per_slot
                    ),
                )

        # Validate: max_mamba_cache_size must be positive after memory allocation.
        # A non-positive value means GPU memory is insufficient for the requested
        # configuration. Fail fast with actionable advice instead of silently
        # producing garbled output at runtime.
        if get_schedule().max_mamba_cache_size <= 0:
            raise RuntimeError(
                f"Not enough GPU memory for hybrid (mamba/linear-attention) state cache. "
                f"Computed max_mamba_cache_size={get_schedule().max_mamba_cache_size} "
                f"(total_rest_memory={total_rest_memory:.2f} GB, "
                f"mamba_cache_per_req={stage_per_req / (1 << 20):.2f} MB). "
                f"Try: (1) reduce --max-running-requests, "
                f"(2) increase --mem-fraction-static, "
                f"(3) reduce --speculative-num-draft-tokens, or "
                f"(4) use GPUs with more memory."
            )

        # +1 accounts for each pool's padding slot.
        mamba_state_memory = (
            (get_schedule().max_mamba_cache_size + 1) * (stage_per_req + extra_per_slot)
            + replayssm_fixed_bytes
        ) / (1 << 30)
        return total_rest_memory - mamba_state_memory

    def logical_token_capacity(self, *, max_total_num_tokens: int) -> int:
        """Request tokens a pool of `max_total_num_tokens` per-rank rows holds."""
        # SWA allocators never widen under DCP.
        if self.is_hybrid_swa:
            return max_total_num_tokens
        # Target rows widen into attn_dcp_size ids; draft sizes already carry
        # loc_space_scale.
        return (
            max_total_num_tokens * get_parallel().attn_dcp_size // self.loc_space_scale
        )

    @property
    def loc_space_scale(self) -> int:
        dcp_size = get_parallel().attn_dcp_size
        return dcp_size if (self.is_draft_worker and dcp_size > 1) else 1

    # ---- end of COPIED ----
