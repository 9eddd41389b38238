"""SGLang 0.5.23's own startup arithmetic for a replica's command line, run in the real-SGLang env
(tests/sglang_startup_real.py says which of the wheel's functions run, and what is stood in for).

    startup_with_real_sglang([{"argv": [...], "env": {...}, "gpu": {"name", "compute_capability", "count",
                               "memory_mib"}, "pre_gib": 90.1, "loaded_gib": 38.2}, ...])
    -> [{"max_total_num_tokens", "max_running_requests", "max_req_len", "context_len", "mamba_ratio",
         "max_mamba_cache_size", "resolved": {...}} or {"error": "AssertionError: Lazy extra buffer ..."}, ...]

The argv's --model-path and --speculative-draft-model-path must be folders holding a config.json (model_folders
writes them); "pre_gib" is what the engine reads as free before the weights load, "loaded_gib" after (GiB, as
get_available_gpu_memory answers). One process warms SGLang's imports once and forks a process per case.
"""

import json
from pathlib import Path

from tests.sglang_real import run_with_real_sglang

SCRIPT = Path(__file__).resolve().parent / "sglang_startup_real.py"


def startup_with_real_sglang(cases: list[dict]) -> list[dict]:
    """The engine's figures, or its refusal, per case (module docstring)."""
    return run_with_real_sglang(SCRIPT, {"cases": cases})["cases"]


def model_folder(store: Path, name: str, config: dict) -> str:
    """A folder under `store` holding `config` as its config.json, for a case's --model-path."""
    folder = store / name
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    return str(folder)
