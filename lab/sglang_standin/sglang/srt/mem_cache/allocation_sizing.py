"""LAB STAND-IN for SGLang 0.5.23's srt/mem_cache/allocation_sizing.py: the function the mamba ratio reads,
copied verbatim (checked against the wheel's text in tests/lab_code/test_sglang_kv_pool.py)."""


# ---- COPIED from the 0.5.23 wheel, srt/mem_cache/allocation_sizing.py ----
def get_mamba_tracking_slots(
    *, extra_buffer: bool, overlap: bool, lazy: bool = False
) -> int:
    """Tracking slots allocated initially; lazy mode defers the second slot."""
    if not extra_buffer:
        return 0
    if lazy:
        return 1
    return 2 if overlap else 1

# ---- end of COPIED ----
