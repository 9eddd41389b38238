"""The SGLang stand-in's max_total_num_tokens (lab/sglang_standin/sglang/srt/kv_pool.py) is what SGLang
0.5.23's own pool sizing gives for the same model, card and loaded weights (tests/sglang_kv_pool_real.py in
the real-SGLang env: KVCacheConfigurator._profile_available_bytes, DefaultPoolConfigurator's cell size and
pool sizes, _apply_token_constraints), for the models' real config.json (tests/fixtures/model_configs) and the
lab hub's tiny Kimi K2.6; and the load it refuses, it refuses too.

What is the stand-in's own is only what it takes as the memory the real engine measures (the card's
memory.total before the load, that less the *.safetensors sizes over the TP ranks after it): the test
hands the real code the same two figures."""

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from lab.sglang_standin.sglang.srt import kv_pool
from tests.lab_code.test_sglang_standin import DRAFT_CONFIG, KIMI_CONFIG
from tests.sglang_real import run_with_real_sglang

CONFIGS = Path(__file__).resolve().parents[1] / "fixtures" / "model_configs"
REAL_SCRIPT = Path(__file__).resolve().parents[1] / "sglang_kv_pool_real.py"
B200_MIB, RTX_PRO_6000_MIB = 183359, 97887  # the GPU stand-in's profiles (lab/gpu_standin/profiles)


def fixture(name: str) -> dict:
    return json.loads((CONFIGS / f"{name}.json").read_text())


# A DFlash drafter's shape: Qwen3-4B's decoder layers as z-lab's DFlashDraftModel names them, 5 of them.
DRAFTER = {**fixture("Qwen3-4B"), "architectures": ["DFlashDraftModel"], "num_hidden_layers": 5}
DFLASH = dict(algorithm="DFLASH", num_draft_tokens=8, max_running_requests=48)
NO_SPEC = dict(algorithm=None, num_draft_tokens=None, max_running_requests=None)
# name: (target config, drafter config or None, TP, card MiB, target + drafter weight bytes, settings)
CASES = {
    "Kimi K2.6 TP 8 on B200, DFlash, trtllm_mla pages": (
        fixture("Kimi-K2.6"), DRAFTER, 8, B200_MIB, (595 * 10**9, 6 * 10**9),
        dict(DFLASH, mem_fraction_static=0.9, page_size=64)),
    "Kimi K2.6 TP 8 on RTX PRO 6000, fp8 KV": (
        fixture("Kimi-K2.6"), DRAFTER, 8, RTX_PRO_6000_MIB, (595 * 10**9, 6 * 10**9),
        dict(DFLASH, mem_fraction_static=0.9, page_size=1, kv_cache_dtype="fp8_e4m3")),
    "Qwen3.6-27B TP 1, DFlash, extra_buffer_lazy": (
        fixture("Qwen3.6-27B"), DRAFTER, 1, RTX_PRO_6000_MIB, (54 * 10**9, 2 * 10**9),
        dict(DFLASH, num_draft_tokens=16, mem_fraction_static=0.9, page_size=1,
             mamba_radix_cache_strategy="extra_buffer_lazy")),
    "Qwen3.6-27B TP 2, no speculation, no radix cache": (
        fixture("Qwen3.6-27B"), None, 2, B200_MIB, (54 * 10**9, 0),
        dict(NO_SPEC, mem_fraction_static=0.8, page_size=1, disable_radix_cache=True)),
    "Qwen3.6-27B TP 1, no speculation, extra_buffer without overlap": (
        fixture("Qwen3.6-27B"), None, 1, B200_MIB, (54 * 10**9, 0),
        dict(NO_SPEC, mem_fraction_static=0.85, page_size=1, mamba_radix_cache_strategy="extra_buffer",
             disable_overlap_schedule=True)),
    "Qwen3-4B TP 2, capped by --max-total-tokens, pages of 16": (
        fixture("Qwen3-4B"), None, 2, RTX_PRO_6000_MIB, (8 * 10**9, 0),
        dict(NO_SPEC, mem_fraction_static=0.9, page_size=16, max_total_tokens=1_000_003)),
    "the lab's tiny Kimi K2.6 TP 8 on B200": (
        KIMI_CONFIG, DRAFT_CONFIG, 8, B200_MIB, (40 * 2**20, 4 * 2**20),
        dict(DFLASH, mem_fraction_static=0.9, page_size=64)),
}
TOO_SMALL = (fixture("Kimi-K2.6"), DRAFTER, 4, RTX_PRO_6000_MIB, (595 * 10**9, 6 * 10**9),
             dict(DFLASH, mem_fraction_static=0.9, page_size=1))  # 150 GB of weights a 96 GB card


def settings(values: dict) -> dict:
    return {"kv_cache_dtype": "auto", "max_total_tokens": None, "disable_radix_cache": False,
            "mamba_radix_cache_strategy": "no_buffer", "disable_overlap_schedule": False, **values}


def model_dirs(root: Path, target: dict, draft: dict | None, weights: tuple[int, int]) -> tuple[Path, Path | None]:
    """Folders with the config and safetensors files of the weights' sizes (sparse: no disk taken)."""
    dirs = []
    for name, config, size in (("target", target, weights[0]), ("draft", draft, weights[1])):
        if config is None:
            dirs.append(None)
            continue
        folder = root / name
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps(config))
        half = size // 2
        for i, part in enumerate((half, size - half)):  # two shards, as a hub's repo holds them
            with open(folder / f"model-{i:05d}-of-00002.safetensors", "wb") as shard:
                shard.truncate(part)
        dirs.append(folder)
    return dirs[0], dirs[1]


def standin(case: tuple, root: Path) -> int | str:
    target, draft, tp, card_mib, weights, values = case
    target_dir, draft_dir = model_dirs(root, target, draft, weights)
    s = settings(values)
    args = SimpleNamespace(
        model_path=str(target_dir), speculative_draft_model_path=str(draft_dir) if draft_dir else None,
        tp_size=tp, mem_fraction_static=s["mem_fraction_static"], page_size=s["page_size"],
        kv_cache_dtype=s["kv_cache_dtype"], speculative_draft_kv_cache_dtype=None,
        max_total_tokens=s["max_total_tokens"], speculative_algorithm=s["algorithm"],
        speculative_num_draft_tokens=s["num_draft_tokens"], max_running_requests=s["max_running_requests"],
        disable_radix_cache=s["disable_radix_cache"], mamba_radix_cache_strategy=s["mamba_radix_cache_strategy"],
        disable_overlap_schedule=s["disable_overlap_schedule"], mamba_full_memory_ratio=None,
        max_mamba_cache_size=None, mamba_ssm_dtype=None)
    try:
        return kv_pool.max_total_num_tokens(args, target, draft, card_mib)
    except ValueError as refused:
        return str(refused)


def real_case(case: tuple, root: Path) -> dict:
    target, draft, tp, card_mib, weights, values = case
    target_dir, draft_dir = model_dirs(root, target, draft, weights)
    pre = card_mib / 1024
    return {"target": str(target_dir), "draft": str(draft_dir) if draft_dir else None, "tp": tp, "pre_gib": pre,
            "loaded_gib": pre - sum(weights) / tp / 2**30, **settings(values)}


@pytest.fixture(scope="module")
def real(tmp_path_factory):
    """SGLang's own figures for every case, in one run of the real env (~30 s: torch's import)."""
    payload = [real_case(case, tmp_path_factory.mktemp("real")) for case in [*CASES.values(), TOO_SMALL]]
    return run_with_real_sglang(REAL_SCRIPT, {"cases": payload})["cases"]


@pytest.mark.parametrize("index", range(len(CASES)), ids=list(CASES))
def test_the_standins_max_total_num_tokens_is_sglangs(real, tmp_path, index):
    case = list(CASES.values())[index]
    assert "error" not in real[index], real[index]
    assert standin(case, tmp_path) == real[index]["max_total_num_tokens"] > 0


def test_weights_that_leave_no_kv_cache_are_refused_as_sglang_refuses_them(real, tmp_path):
    assert real[-1]["error"].startswith("ValueError: Loaded weights leave no GPU memory for the KV cache under "
                                        "--mem-fraction-static=0.9."), real[-1]
    assert standin(TOO_SMALL, tmp_path).startswith("Loaded weights leave no GPU memory for the KV cache under "
                                                   "--mem-fraction-static=0.9.")
