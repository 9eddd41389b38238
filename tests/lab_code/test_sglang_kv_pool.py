"""The SGLang stand-in's startup (lab/sglang_standin/sglang/srt/kv_pool.py and the release's code it copies) is
SGLang 0.5.23's: its max_total_num_tokens, max_running_requests and longest request are what the wheel's own
functions give for the same model, card and loaded weights (tests/sglang_kv_pool_real.py in the real-SGLang env:
KVCacheConfigurator._resolve_memory_pool_config, ModelConfig's context), for the models' real config.json
(tests/fixtures/model_configs) and the lab hub's tiny Kimi K2.6; what the wheel refuses (weights that leave no
pool, the lazy extra buffer without the overlap scheduler), it refuses with the wheel's words; and every
function it copies is the wheel's text.

What is the stand-in's own is only what it takes as the memory the real engine measures (the card's
memory.total before the load, that less the *.safetensors sizes over the TP ranks after it): the test
hands the real code the same two figures."""

import ast
import json
from pathlib import Path

import pytest

from tests.lab_code.test_sglang_standin import DRAFT_CONFIG, KIMI_CONFIG, STANDIN_SRC, standin_startup
from tests.sglang_real import ENV_DIR, real_sglang_python, run_with_real_sglang

CONFIGS = Path(__file__).resolve().parents[1] / "fixtures" / "model_configs"
REAL_SCRIPT = Path(__file__).resolve().parents[1] / "sglang_kv_pool_real.py"
B200_MIB, RTX_PRO_6000_MIB = 183359, 97887  # the GPU stand-in's profiles (lab/gpu_standin/profiles)


def fixture(name: str) -> dict:
    return json.loads((CONFIGS / f"{name}.json").read_text())


# A DFlash drafter's shape: Qwen3-4B's decoder layers as z-lab's DFlashDraftModel names them, 5 of them.
DRAFTER = {**fixture("Qwen3-4B"), "architectures": ["DFlashDraftModel"], "num_hidden_layers": 5}
# DFLASH's resolution sets max_running_requests to 48 where it is not given (arg_groups/speculative_hook.py).
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
    "Qwen3.6-27B TP 1 on RTX PRO 6000, DFlash, extra_buffer_lazy: capped by its state slots": (
        fixture("Qwen3.6-27B"), DRAFTER, 1, RTX_PRO_6000_MIB, (54 * 10**9, 2 * 10**9),
        dict(DFLASH, num_draft_tokens=16, mem_fraction_static=0.9, page_size=1, context_length=163840,
             mamba_radix_cache_strategy="extra_buffer_lazy")),
    "Qwen3.6-27B TP 1 on RTX PRO 6000, DFlash, no_buffer without overlap": (
        fixture("Qwen3.6-27B"), DRAFTER, 1, RTX_PRO_6000_MIB, (54 * 10**9, 2 * 10**9),
        dict(DFLASH, num_draft_tokens=16, mem_fraction_static=0.9, page_size=1,
             mamba_radix_cache_strategy="no_buffer", disable_overlap_schedule=True)),
    "Qwen3-4B TP 1, no speculation: the requests from the pool, not a flag": (
        fixture("Qwen3-4B"), None, 1, RTX_PRO_6000_MIB, (8 * 10**9, 0),
        dict(NO_SPEC, mem_fraction_static=0.9, page_size=1, context_length=4096)),
    "the lab's tiny Kimi K2.6 TP 8 on B200": (
        KIMI_CONFIG, DRAFT_CONFIG, 8, B200_MIB, (40 * 2**20, 4 * 2**20),
        dict(DFLASH, mem_fraction_static=0.9, page_size=64)),
}
TOO_SMALL = (fixture("Kimi-K2.6"), DRAFTER, 4, RTX_PRO_6000_MIB, (595 * 10**9, 6 * 10**9),
             dict(DFLASH, mem_fraction_static=0.9, page_size=1))  # 150 GB of weights a 96 GB card
# DDTree's layout as qwen36_ddtree shipped it: the lazy extra buffer, and no overlap scheduler (DDTree forces it
# off), which 0.5.23 asserts on when it sizes the pool, after the weights load.
LAZY_WITHOUT_OVERLAP = (fixture("Qwen3.6-27B"), DRAFTER, 1, RTX_PRO_6000_MIB, (54 * 10**9, 2 * 10**9),
                        dict(DFLASH, num_draft_tokens=16, mem_fraction_static=0.9, page_size=1,
                             mamba_radix_cache_strategy="extra_buffer_lazy", disable_overlap_schedule=True))
LAZY_ASSERTION = "AssertionError: Lazy extra buffer requires overlap schedule (--disable-overlap-schedule is incompatible)"
REFUSED = [TOO_SMALL, LAZY_WITHOUT_OVERLAP]


def settings(values: dict) -> dict:
    return {"kv_cache_dtype": "auto", "max_total_tokens": None, "disable_radix_cache": False, "context_length": None,
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


def standin_case(case: tuple, root: Path) -> dict:
    target, draft, tp, card_mib, weights, values = case
    target_dir, draft_dir = model_dirs(root, target, draft, weights)
    s = settings(values)
    args = dict(
        model_path=str(target_dir), speculative_draft_model_path=str(draft_dir) if draft_dir else None,
        tp_size=tp, pp_size=1, dp_size=1, attn_dp_size=1, disaggregation_mode="null", trust_remote_code=False,
        mem_fraction_static=s["mem_fraction_static"],
        page_size=s["page_size"], kv_cache_dtype=s["kv_cache_dtype"], speculative_draft_kv_cache_dtype=None,
        max_total_tokens=s["max_total_tokens"], speculative_algorithm=s["algorithm"],
        speculative_num_draft_tokens=s["num_draft_tokens"], max_running_requests=s["max_running_requests"],
        disable_radix_cache=s["disable_radix_cache"], mamba_radix_cache_strategy=s["mamba_radix_cache_strategy"],
        disable_overlap_schedule=s["disable_overlap_schedule"], mamba_full_memory_ratio=None,
        max_mamba_cache_size=None, mamba_ssm_dtype=None, context_length=s["context_length"])
    return {"args": args, "card_mib": card_mib}


@pytest.fixture(scope="module")
def standin(tmp_path_factory):
    """The stand-in's figures for every case, in one run of its package."""
    return standin_startup([standin_case(case, tmp_path_factory.mktemp("standin"))
                            for case in [*CASES.values(), *REFUSED]])


def real_case(case: tuple, root: Path) -> dict:
    target, draft, tp, card_mib, weights, values = case
    target_dir, draft_dir = model_dirs(root, target, draft, weights)
    pre = card_mib / 1024
    return {"target": str(target_dir), "draft": str(draft_dir) if draft_dir else None, "tp": tp, "pre_gib": pre,
            "loaded_gib": pre - sum(weights) / tp / 2**30, **settings(values)}


@pytest.fixture(scope="module")
def real(tmp_path_factory):
    """SGLang's own figures for every case, in one run of the real env (~30 s: torch's import)."""
    payload = [real_case(case, tmp_path_factory.mktemp("real")) for case in [*CASES.values(), *REFUSED]]
    return run_with_real_sglang(REAL_SCRIPT, {"cases": payload})["cases"]


@pytest.mark.parametrize("index", range(len(CASES)), ids=list(CASES))
def test_the_standins_startup_is_sglangs(real, standin, index):
    assert "error" not in real[index], real[index]
    assert standin[index] == real[index]
    assert real[index]["max_total_num_tokens"] > 0 and real[index]["max_running_requests"] > 0


def test_qwen36_on_one_rtx_pro_6000_runs_a_handful_of_requests_not_48(real, standin):
    """The state slots, not DFLASH's 48, cap the requests: what the lab's bench must meet."""
    index = list(CASES).index("Qwen3.6-27B TP 1 on RTX PRO 6000, DFlash, extra_buffer_lazy: capped by its state slots")
    assert 2 <= standin[index]["max_running_requests"] <= 8
    assert standin[index]["max_req_len"] == 163840 - 1


def test_the_sized_as_knob_sizes_a_lab_server_as_for_the_real_checkpoint(real, tmp_path):
    """A lab server of the hub's tiny Qwen, told to size for Qwen3.6-27B and its drafter, meets their cap."""
    index = list(CASES).index("Qwen3.6-27B TP 1 on RTX PRO 6000, DFlash, extra_buffer_lazy: capped by its state slots")
    (tmp_path / "real").mkdir(), (tmp_path / "tiny").mkdir()
    real_sized = standin_case(list(CASES.values())[index], tmp_path / "real")
    tiny = standin_case((KIMI_CONFIG, DRAFT_CONFIG, *list(CASES.values())[index][2:]), tmp_path / "tiny")
    knobs = tmp_path / "knobs.json"
    knobs.write_text(json.dumps({"sized_as": {"target": real_sized["args"]["model_path"],
                                              "drafter": real_sized["args"]["speculative_draft_model_path"]}}))
    assert standin_startup([tiny], knobs) == [real[index]]
    assert standin_startup([tiny]) != [real[index]]


def test_weights_that_leave_no_kv_cache_are_refused_as_sglang_refuses_them(real, standin):
    refused = len(CASES) + REFUSED.index(TOO_SMALL)
    for answer in (real[refused], standin[refused]):
        assert answer["error"].startswith("ValueError: Loaded weights leave no GPU memory for the KV cache under "
                                          "--mem-fraction-static=0.9."), answer


def test_the_lazy_extra_buffer_without_overlap_is_refused_as_sglang_asserts(real, standin):
    refused = len(CASES) + REFUSED.index(LAZY_WITHOUT_OVERLAP)
    assert real[refused] == standin[refused] == {"error": LAZY_ASSERTION}


# What the stand-in copies of the wheel: (its file, the wheel's file, the names, a class's as Class.method).
COPIES = [
    ("mem_cache/kv_cache_configurator.py", "mem_cache/kv_cache_configurator.py",
     ["_pd_prefill_skips_mamba_spec_state", "mm_runtime_reservation_gb", "MAMBA_CACHE_SIZE_MAX_RUNNING_REQUESTS_RATIO",
      "MAMBA_CACHE_BASE_RATIO_DROP_ON_SKIP", "MAMBA_CACHE_V2_ADDITIONAL_RATIO_NO_BUFFER",
      *(f"KVCacheConfigurator.{m}" for m in ("_profile_available_bytes", "_calculate_mamba_ratio",
                                             "_apply_token_constraints", "resolve_max_num_reqs",
                                             "_resolve_memory_pool_config", "config_from_budget",
                                             "_handle_max_mamba_cache"))]),
    ("mem_cache/allocation_sizing.py", "mem_cache/allocation_sizing.py", ["get_mamba_tracking_slots"]),
    ("model_executor/pool_configurator.py", "model_executor/pool_configurator.py",
     ["MemoryPoolConfig", "MemoryPoolConfigurator.finalize_with_max_running_requests",
      "DefaultPoolConfigurator.calculate_pool_sizes", "DefaultPoolConfigurator.calculate_pool_sizes_from_max_tokens"]),
    ("configs/model_config.py", "utils/hf_transformers/common.py", ["CONTEXT_LENGTH_KEYS", "get_context_length"]),
    ("configs/model_config.py", "configs/model_config.py", ["ModelConfig._derive_context_length"]),
]


def definition(source: str, name: str) -> str:
    """The syntax tree of `name` (a function, class or constant; Class.method) in `source`, dumped."""
    owner, _, member = name.rpartition(".")
    body = ast.parse(source).body
    if owner:
        (cls,) = [n for n in body if isinstance(n, ast.ClassDef) and n.name == owner]
        body = cls.body
    found = [n for n in body if getattr(n, "name", None) == member or
             (isinstance(n, ast.Assign) and any(getattr(t, "id", None) == member for t in n.targets))]
    assert len(found) == 1, f"{name}: {len(found)} definitions"
    return ast.dump(found[0])


@pytest.mark.parametrize("copy", COPIES, ids=[f"{c[0]}:{c[1]}" for c in COPIES])
def test_what_the_standin_copies_is_the_wheels_text(copy):
    ours, theirs, names = copy
    real_sglang_python()  # the env (and its wheel) built on first use
    (wheel,) = ENV_DIR.glob("lib/python3*/site-packages/sglang/srt")
    standin_text = (STANDIN_SRC / "sglang" / "srt" / ours).read_text()
    wheel_text = (wheel / theirs).read_text()
    for name in names:
        assert definition(standin_text, name) == definition(wheel_text, name), name
