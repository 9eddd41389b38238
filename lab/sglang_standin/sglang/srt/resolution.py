"""LAB STAND-IN for SGLang 0.5.23's argument resolution (`ServerArgs.resolve_once`).

The real resolution runs ~70 post-init hooks; this holds the ones a specfleet deploy can
meet, copied from the 0.5.23 wheel's source (paths below are inside it) with its messages,
and tests/unit/test_sglang_resolution.py checks that the stand-in and the real release agree
on every host class x profile and on deliberately bad combinations. The DDTree build adds the
refusals of PR #29907 (which no release has).

The GPU comes from `nvidia-smi --query-gpu` (on a lab host: the GPU stand-in), as the real
SGLang reads its memory through nvidia-smi and its compute capability through the driver.
"""

import json
import os
import subprocess
from pathlib import Path

NO_ACCELERATOR = "No accelerator (CUDA, XPU, HPU, NPU, MUSA, MPS) or platform plugin is available."
# SpeculativeAlgorithm members of 0.5.23 (NEXTN is its alias of EAGLE).
KNOWN_ALGORITHMS = {"DFLASH", "UNO", "DSPARK", "EAGLE", "EAGLE3", "NEXTN",
                    "FROZEN_KV_MTP", "STANDALONE", "NGRAM"}
DDTREE_TREE_BACKENDS = ("triton",)  # PR #29907 since 93e9850e4: the full-tree verify is triton-only
DDTREE_BUDGET_RANGE = (1, 1024)
# The target backends that draft a tree over pages above one token (speculative_hook.py _handle_eagle_family,
# _PAGE_TREE_SPEC_BACKENDS).
EAGLE_PAGED_TREE_BACKENDS = ("flashinfer", "fa3", "triton")
# arg_groups/overrides.py _MAMBA_RADIX_CACHE_ARCHS and _MAMBA_EXTRA_BUFFER_ARCHS: the hybrid classes among
# the lab's models (Qwen3.5/3.6, Qwen3-Next) are in both.
MAMBA_EXTRA_BUFFER_ARCHS = {"Qwen3_5ForConditionalGeneration", "Qwen3_5MoeForConditionalGeneration",
                            "Qwen3_5ForCausalLM", "Qwen3_5MoeForCausalLM", "Qwen3NextForCausalLM"}


def visible_gpus(count: int, setting: str | None) -> list[int]:
    """The host's GPUs CUDA shows this process, in CUDA's order: CUDA_VISIBLE_DEVICES's indices up to the
    first one that names no GPU ("If one of the indices is invalid, only the devices whose index precedes
    the invalid index are visible to CUDA applications": CUDA C Programming Guide, CUDA Environment
    Variables); unset, all of them. nvidia-smi, like the real one (NVML), ignores the variable."""
    if setting is None:
        return list(range(count))
    shown = []
    for word in setting.split(","):
        word = word.strip()
        if not word.isdigit() or int(word) >= count or int(word) in shown:
            break
        shown.append(int(word))
    return shown


def query_gpu() -> dict:
    """Compute capability, count and memory of the host's GPUs, from nvidia-smi (which sees all of
    them, as the real SGLang's get_nvgpu_memory_capacity does), and those CUDA shows this process."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=compute_cap,memory.total",
                              "--format=csv,noheader,nounits"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        raise RuntimeError(NO_ACCELERATOR)
    rows = [line.split(",") for line in out.strip().splitlines()]
    visible = visible_gpus(len(rows), os.environ.get("CUDA_VISIBLE_DEVICES"))
    if not visible:  # torch.cuda.is_available() is False: no CUDA device to run on
        raise RuntimeError(NO_ACCELERATOR)
    major, minor = (int(part) for part in rows[0][0].strip().split("."))
    return {"capability": (major, minor), "count": len(rows), "memory_mib": min(float(r[1]) for r in rows),
            "visible": visible}


def read_config(model_dir: str) -> dict:
    """config.json as transformers reads a local folder; its message when there is none."""
    try:
        return json.loads((Path(model_dir) / "config.json").read_text())
    except (OSError, ValueError):
        raise OSError(f"{model_dir} does not appear to have a file named config.json. "
                      f"Checkout 'https://huggingface.co/{model_dir}/tree/main' for available files.")


def resolve(args, ddtree_build: bool) -> None:
    """Resolve `args` (the parsed namespace) in place, or raise what the real resolution raises."""
    gpu = query_gpu()
    args.device = "cuda"
    target = read_config(args.model_path)
    _attention_backend(args, gpu["capability"])
    _speculative(args, ddtree_build)
    _mamba_radix_cache(args, (target.get("architectures") or [""])[0])


def _attention_backend(args, capability: tuple[int, int]) -> None:
    """srt/arg_groups/overrides.py (_mla_backend_page_constraints, _mla_kv_cache_dtype_checks,
    _page_size_default) and attention_hook.py (handle_attention_backend_compatibility)."""
    major = capability[0]
    backends = (args.attention_backend, args.decode_attention_backend, args.prefill_attention_backend)
    if "trtllm_mla" in backends:
        if args.page_size not in (32, 64):
            args.page_size = 64  # "TensorRT-LLM MLA only supports page_size of 32 or 64, changing ..."
        if major not in (10, 11, 12):
            raise ValueError("TRTLLM MLA backend is only supported on Blackwell GPUs (SM100/SM12x). "
                             "Please use a different backend.")
    if "trtllm_mha" in (*backends, args.speculative_draft_attention_backend):
        if args.page_size not in (16, 32, 64, 128):
            args.page_size = 64  # "TensorRT-LLM MHA only supports page_size of 16, 32, 64 or 128, ..."
        if "trtllm_mha" in backends and major not in (9, 10, 12):
            raise ValueError("TRTLLM MHA backend for decode is only supported on Hopper (SM90), Blackwell "
                             "(SM100) and (SM120) GPUs. Please use a different decode backend.")
    if args.page_size is None:
        args.page_size = 1


def _speculative(args, ddtree_build: bool) -> None:
    """srt/arg_groups/speculative_hook.py (_handle_dflash, _handle_eagle_family, _handle_ngram) and, on the
    DDTree build, PR #29907."""
    if args.speculative_algorithm is None:
        return
    algo = args.speculative_algorithm = args.speculative_algorithm.upper()
    if algo not in KNOWN_ALGORITHMS | ({"DDTREE"} if ddtree_build else set()):
        raise ValueError(f"Unknown speculative algorithm name: {algo}")
    if algo == "NEXTN":  # _resolve_speculative_algorithm_alias: NEXTN is EAGLE's alias
        algo = args.speculative_algorithm = "EAGLE"
    if algo in ("EAGLE", "EAGLE3"):
        _eagle_family(args)
    elif algo == "NGRAM":
        _ngram(args)
    if algo not in ("DFLASH", "DDTREE"):
        return
    if args.pp_size != 1:
        raise ValueError("Currently DFLASH speculative decoding only supports pp_size == 1.")
    if args.speculative_draft_model_path is None:
        raise ValueError("DFLASH speculative decoding requires setting --speculative-draft-model-path.")
    args.speculative_num_steps = args.speculative_eagle_topk = 1
    if args.speculative_dflash_block_size is not None:
        if args.speculative_num_draft_tokens not in (None, args.speculative_dflash_block_size):
            raise ValueError(
                "Both --speculative-num-draft-tokens and --speculative-dflash-block-size are set but they "
                "differ. For DFLASH they must match. "
                f"speculative_num_draft_tokens={args.speculative_num_draft_tokens}, "
                f"speculative_dflash_block_size={args.speculative_dflash_block_size}.")
        args.speculative_num_draft_tokens = args.speculative_dflash_block_size
    elif args.speculative_num_draft_tokens is None:
        draft = read_config(args.speculative_draft_model_path)
        args.speculative_num_draft_tokens = draft.get("dflash_config", {}).get("block_size") or 16
    block = args.speculative_num_draft_tokens
    if args.speculative_draft_window_size is not None and args.speculative_draft_window_size < block:
        raise ValueError("--speculative-draft-window-size must be >= --speculative-num-draft-tokens "
                         f"(block_size). window_size={args.speculative_draft_window_size}, block_size={block}.")
    if args.max_running_requests is None:
        args.max_running_requests = 48
    if algo == "DDTREE":
        _ddtree(args, block)


def _eagle_family(args) -> None:
    """_handle_eagle_family's defaults and refusals for a model drafting through EAGLE (its own MTP layers, or
    an EAGLE-3 drafter): 48 running requests unless set; steps, top-k and draft tokens chosen together
    (3, 1, 4: _auto_choose_speculative_params for the lab's models) or steps given; a chain's draft tokens
    moved to steps + 1; trtllm_mha verifies chains only; a tree over pages above one token needs one of
    _PAGE_TREE_SPEC_BACKENDS."""
    if args.max_running_requests is None:
        args.max_running_requests = 48
    if args.speculative_num_steps is None:
        assert args.speculative_eagle_topk is None and args.speculative_num_draft_tokens is None
        args.speculative_num_steps, args.speculative_eagle_topk, args.speculative_num_draft_tokens = 3, 1, 4
    backends = (args.attention_backend, args.decode_attention_backend, args.prefill_attention_backend)
    if "trtllm_mha" in backends and args.speculative_eagle_topk > 1:
        raise ValueError("trtllm_mha backend only supports topk = 1 for speculative decoding.")
    if args.speculative_eagle_topk == 1 and args.speculative_num_draft_tokens != args.speculative_num_steps + 1:
        args.speculative_num_draft_tokens = args.speculative_num_steps + 1  # with a warning, as the release
    tree = args.speculative_eagle_topk > 1
    if tree and args.page_size > 1 and args.attention_backend not in EAGLE_PAGED_TREE_BACKENDS:
        raise ValueError(f"speculative_eagle_topk > 1 with page_size > 1 is only supported on "
                         f"{EAGLE_PAGED_TREE_BACKENDS}; got attention_backend={args.attention_backend!r}. Use "
                         "page_size == 1 or one of those backends.")


def _ngram(args) -> None:
    """_handle_ngram's defaults and its refusal on a paged backend: 48 running requests unless set, no mixed
    chunks, the trie's breadth as top-k, 12 draft tokens unless set, steps = draft tokens // top-k; a trie wider
    than one over pages above one token runs on flashinfer only."""
    if args.max_running_requests is None:
        args.max_running_requests = 48
    args.enable_mixed_chunk = False
    args.speculative_eagle_topk = args.speculative_ngram_max_bfs_breadth
    if args.speculative_num_draft_tokens is None:
        args.speculative_num_draft_tokens = 12
    if args.speculative_num_steps is None:
        args.speculative_num_steps = args.speculative_num_draft_tokens // args.speculative_eagle_topk
    if args.speculative_eagle_topk > 1 and args.page_size > 1 and args.attention_backend != "flashinfer":
        raise ValueError(f"speculative_eagle_topk({args.speculative_eagle_topk}) > 1 with "
                         f"page_size({args.page_size}) > 1 is unstable and produces incorrect results for paged "
                         "attention backends. This combination is only supported for the 'flashinfer' backend.")


def _ddtree(args, block: int) -> None:
    """PR #29907's refusals, as the deploy's profile rules state them (operations/server/flags.py): a
    budget above block - 1 builds a tree, whose verify is triton-only; a smaller one verifies one chain
    (spine mode) on any backend that allows one-token pages."""
    if args.page_size != 1:
        raise ValueError("DDTREE currently supports only page_size == 1")
    if args.speculative_use_rejection_sampling:
        raise ValueError("DDTREE does not support --speculative-use-rejection-sampling")
    if args.speculative_ddtree_budget is None:
        args.speculative_ddtree_budget = block - 1  # speculative/ddtree_worker.py: spine mode
    budget = args.speculative_ddtree_budget
    low, high = DDTREE_BUDGET_RANGE
    if not low <= budget <= high:
        raise ValueError(f"DDTREE budget must be within [{low}, {high}], not {budget}")
    if budget > block - 1 and args.attention_backend not in DDTREE_TREE_BACKENDS:
        raise ValueError(f"DDTREE tree mode (budget {budget} > draft tokens - 1 = {block - 1}) needs the target "
                         f"attention backend {', '.join(DDTREE_TREE_BACKENDS)}, not {args.attention_backend}")
    args.disable_overlap_schedule = True  # PR #29907 runs without the overlap scheduler


def _mamba_radix_cache(args, architecture: str) -> None:
    """arg_groups/overrides.py _mamba_radix_cache_resolution (a post-process, after the hooks above): `auto`
    takes the extra buffer where the overlap scheduler runs or pages hold more than one token and the model
    and the linear-attention backend (triton) support it, else no buffer without the overlap scheduler."""
    if architecture not in MAMBA_EXTRA_BUFFER_ARCHS or args.disable_radix_cache:
        return
    if args.mamba_radix_cache_strategy == "auto":
        wants_overlap = not args.disable_overlap_schedule
        wants_paging = args.page_size is not None and args.page_size > 1
        if (wants_overlap or wants_paging) and args.linear_attn_backend == "triton":
            args.mamba_radix_cache_strategy = "extra_buffer"
        else:
            args.mamba_radix_cache_strategy = "no_buffer"
            args.disable_overlap_schedule = True


def check(args) -> None:
    """srt/arg_groups/validation_hook.py (check_server_args), which the engine runs before it launches:
    the parallel-size rules a multi-node deploy can meet, with the release's messages."""
    assert (args.tp_size * args.pp_size) % args.nnodes == 0, "tp_size must be divisible by number of nodes"
    assert not (args.dp_size > 1 and args.nnodes != 1), (
        "multi-node data-parallel replicas are not supported; use attention DP (--attn-dp-size) across nodes")
