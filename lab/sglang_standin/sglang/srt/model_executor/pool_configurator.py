"""LAB STAND-IN for SGLang 0.5.23's srt/model_executor/pool_configurator.py: the default configurator that
turns the KV budget into tokens (the one a specfleet layout gets: no sliding window, no DeepSeek-V4 pools).

MemoryPoolConfig and the sizing methods are the release's text, copied verbatim (checked against the wheel
in tests/lab_code/test_sglang_kv_pool.py); the bytes a token takes are the stand-in's reading of
_compute_cell_size and the DFlash drafter's cell (srt/kv_cells.py), checked against the wheel's functions in
the same test.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from sglang.srt import kv_cells
from sglang.srt.runtime_context import get_model, get_parallel, get_schedule, get_spec


# ---- COPIED from the 0.5.23 wheel, srt/model_executor/pool_configurator.py ----
@dataclass
class MemoryPoolConfig:
    """Resolved memory pool config, shared between target and draft workers."""

    max_total_num_tokens: int
    max_running_requests: Optional[int] = None
    full_max_total_num_tokens: Optional[int] = None
    swa_max_total_num_tokens: Optional[int] = None
    unified_memory_pool_bytes: Optional[int] = None

    # DSV4 compressed-attention pool sizes (target only; draft workers leave at 0).
    c4_max_total_num_tokens: int = 0
    c128_max_total_num_tokens: int = 0
    c4_state_pool_size: int = 0
    c128_state_pool_size: int = 0

    mem_fraction_static: Optional[float] = None

    # Unified pool only: the profiled byte budget the buffer is sized from,
    # instead of re-summing token counts; None when a user token cap is the budget.
    unified_total_bytes: Optional[int] = None

    def __post_init__(self):
        if self.max_total_num_tokens <= 0:
            msg = "Not enough memory. Please try to increase --mem-fraction-static."
            if self.mem_fraction_static is not None:
                msg += f" Current value: mem_fraction_static={self.mem_fraction_static}"
            raise RuntimeError(msg)
# ---- end of COPIED ----


class MemoryPoolConfigurator:
    # ---- COPIED from the 0.5.23 wheel, srt/model_executor/pool_configurator.py (MemoryPoolConfigurator) ----
    def finalize_with_max_running_requests(
        self, config: MemoryPoolConfig
    ) -> MemoryPoolConfig:
        return config

    # ---- end of COPIED ----


class DefaultPoolConfigurator(MemoryPoolConfigurator):
    """Standard models: a token costs the configurator's cell, nothing fixed besides."""

    def __init__(self, kvc):
        tp = get_parallel().attn_tp_size
        self._cell_size = kv_cells.target_cell_bytes(kvc.model_config.config, tp, kvc.kv_cache_dtype_str or "auto")
        draft = kvc.spec_aux_config.draft_model_config
        if kvc.spec_algorithm.is_dflash_family() and draft is not None:
            # mem_cache/draft_kv_budget.py resolve_dflash_draft_cell_size: the drafter's KV dtype, its cell.
            dtype = get_spec().speculative_draft_kv_cache_dtype or get_model().kv_cache_dtype
            self._cell_size += kv_cells.draft_cell_bytes(draft.config, tp, dtype)
        self._fixed_overhead_bytes = 0  # no logical-page KV sharding
        self._zero_kv_max_tokens = get_schedule().max_total_tokens or kvc.model_config.context_len

    # ---- COPIED from the 0.5.23 wheel, srt/model_executor/pool_configurator.py (DefaultPoolConfigurator) ----
    def calculate_pool_sizes(
        self, available_bytes: int, page_size: int
    ) -> MemoryPoolConfig:
        available_bytes = max(available_bytes - self._fixed_overhead_bytes, 0)
        max_total_num_tokens = (
            available_bytes // self._cell_size
            if self._cell_size
            else self._zero_kv_max_tokens
        )
        max_total_num_tokens = max_total_num_tokens // page_size * page_size
        return MemoryPoolConfig(max_total_num_tokens=max_total_num_tokens)

    def calculate_pool_sizes_from_max_tokens(
        self, max_total_num_tokens: int, page_size: int
    ) -> MemoryPoolConfig:
        max_total_num_tokens = max_total_num_tokens // page_size * page_size
        return MemoryPoolConfig(max_total_num_tokens=max_total_num_tokens)

    # ---- end of COPIED ----


def create_memory_pool_configurator(kvc) -> MemoryPoolConfigurator:
    """The release picks DSV4/sliding-window configurators for those models; the lab's have none."""
    return DefaultPoolConfigurator(kvc)
