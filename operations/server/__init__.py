"""The SGLang server: its flags (spelled per release, validated by the host's SGLang), its unit (restarted
only when its inputs change, one decision per run), its launcher and API key, readiness and rollback."""
