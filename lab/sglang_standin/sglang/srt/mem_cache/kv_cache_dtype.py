"""LAB STAND-IN for SGLang 0.5.23's srt/mem_cache/kv_cache_dtype.py configure_kv_cache_dtype: the KV cache's
element type, named ("auto" is the model's dtype; a drafter takes --speculative-draft-kv-cache-dtype where
given)."""


def configure_kv_cache_dtype(*, server_args_kv_cache_dtype: str, model, model_dtype: str, is_draft_worker: bool,
                             is_dflash: bool, speculative_draft_attention_backend: str | None,
                             speculative_draft_kv_cache_dtype: str | None = None) -> tuple[str | None, str]:
    if is_draft_worker and speculative_draft_kv_cache_dtype is not None:
        server_args_kv_cache_dtype = speculative_draft_kv_cache_dtype
    if server_args_kv_cache_dtype in (None, "auto"):
        return None, model_dtype
    return server_args_kv_cache_dtype, server_args_kv_cache_dtype
