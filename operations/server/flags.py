"""SGLang's command line validated by the SGLang installed on the host (deployment/server/command_line.py
renders it)."""

import json
import shlex

from pyinfra.api import FactBase

from operations.basics.untrusted import printable

# What the host runs to validate a command line: SGLang's own construction, as
# `sglang serve` does it (prepare_server_args: argparse), then its full resolution
# (ServerArgs.resolve_once: the post-init hooks that reject or rewrite combinations
# argparse accepts) and the checks the engine runs before it launches anything
# (check_server_args: e.g. a TP size that the nodes do not divide), without loading the
# model. On a GPU host it sees the real GPU.
# Given the host's card memory (`sizing`), it then runs what the engine's scheduler runs once the
# weights are loaded, with the weights' sizes on disk: ModelConfig (the context), the
# KVCacheConfigurator's _resolve_memory_pool_config (the budget, the mamba state slots and
# _calculate_mamba_ratio's assertions, the pool's tokens, resolve_max_num_reqs) and the longest
# request (managers/tp_worker.py), all the installed engine's own code; only the free memory it
# would measure is answered (`before_load_mib`, the planner's figure for a rank before its load, then
# that less the weights over the TP ranks) and the runtime's placement is one rank. A pool below
# `min_tokens` (None: one full context) is refused with the engine's figures.
# Before the weights are on disk (a first preflight) only argparse can run: the
# hooks read the model's config. The lab's SGLang stand-in answers the same calls,
# and tests/sglang_real.py runs this very text in the real SGLang 0.5.23.
RESOLVE = r"""
import contextlib, glob, io, json, os, sys, types
from sglang.srt.server_args import prepare_server_args


def startup(server_args, sizing):
    # The scheduler's startup after the load (model_executor/model_runner.py init_kv_cache_configurator,
    # alloc_memory_pool; managers/tp_worker.py): {"max_total_num_tokens", "max_running_requests", ...}.
    import sglang.srt.mem_cache.kv_cache_configurator as kvcm
    from sglang.srt.configs.model_config import AttentionArch, ModelConfig
    from sglang.srt.mem_cache.kv_cache_dtype import configure_kv_cache_dtype
    from sglang.srt.model_executor.model_runner_components.layer_setup import ModelLayerInfo
    from sglang.srt.model_executor.model_runner_components.spec_aux_hidden_state import SpecAuxHiddenStateConfig
    from sglang.srt.runtime_context import SpawnRanks, get_parallel, publish
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    publish(server_args, role="scheduler", ranks=SpawnRanks(world_rank=0, dp_rank=None, gpu_id=0))
    target = ModelConfig.from_server_args(server_args)
    draft_path = server_args.speculative_draft_model_path
    draft = ModelConfig.from_server_args(server_args, model_path=draft_path, is_draft_model=True)         if draft_path else None
    spec = SpeculativeAlgorithm.from_string(server_args.speculative_algorithm)
    _, kv_dtype = configure_kv_cache_dtype(
        server_args_kv_cache_dtype=server_args.kv_cache_dtype, model=None, model_dtype=target.dtype,
        is_draft_worker=False, is_dflash=False, speculative_draft_attention_backend=None)
    weights = sum(os.path.getsize(f) for folder in (server_args.model_path, draft_path) if folder
                  for f in glob.glob(os.path.join(folder, "*.safetensors")))
    pre_gib = sizing["before_load_mib"] / 1024
    loaded_gib = pre_gib - weights / server_args.tp_size / (1 << 30)
    kvcm.get_available_gpu_memory = lambda *args, **kwargs: loaded_gib
    get_parallel().override_permanently(world_group=types.SimpleNamespace(cpu_group=None))

    class Configurator(kvcm.KVCacheConfigurator):
        def fused_entry_bytes(self, sub_pool_name):
            return None  # no fused draft pool: the default layout

    layers = target.num_hidden_layers
    kvc = Configurator(
        device="cuda", gpu_id=0, attn_dp_size=get_parallel().attn_dp_size, pp_size=1, pp_group=None, model=None,
        model_config=target, server_args=server_args, kv_cache_dtype=kv_dtype, model_dtype=target.dtype,
        page_size=server_args.page_size, sliding_window_size=None, spec_algorithm=spec, is_draft_worker=False,
        post_capture_kv_active=False,
        spec_aux_config=SpecAuxHiddenStateConfig(
            dflash_draft_num_layers=draft.num_hidden_layers if draft and spec.is_dflash_family() else None,
            draft_model_config=draft),
        is_hybrid_swa=False, is_hybrid_swa_compress=False, use_mla_backend=target.attention_arch == AttentionArch.MLA,
        layer_info=ModelLayerInfo(start_layer=0, end_layer=layers, num_effective_layers=layers), forward_stream=None,
        req_to_token_pool=None, token_to_kv_pool_allocator=None, memory_pool_config=None,
        kv_cache_dtype_str=server_args.kv_cache_dtype)
    config = kvc._resolve_memory_pool_config(pre_gib)
    tokens = kvc.logical_token_capacity(max_total_num_tokens=config.max_total_num_tokens)
    max_req_len = min(target.context_len - 1, tokens - 1)
    assert max_req_len > 0, "Memory pool size is too small"
    return {"max_total_num_tokens": int(tokens), "max_running_requests": int(config.max_running_requests),
            "max_req_len": int(max_req_len), "context_len": int(target.context_len)}


def short(sized, sizing):
    # The refusal of a pool below the floor, in the engine's figures; None when it holds the floor.
    floor = sizing.get("min_tokens") or sized["context_len"]
    if sized["max_total_num_tokens"] >= floor:
        return None
    wanted = (f"min_kv_tokens {floor}" if sizing.get("min_tokens")
              else f"one full context ({floor} tokens, the min_kv_tokens default)")
    return (f"its startup sizes max_total_num_tokens={sized['max_total_num_tokens']} on "
            f"{sizing['card_mib']} MiB GPUs, fewer than {wanted}")


def resolve(argv, sizing=None):
    # What SGLang makes of argv: {"resolved": {...}, "startup": {...}} or {"error": "why it refuses"}.
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr):
            server_args = prepare_server_args(argv)
    except SystemExit:
        lines = stderr.getvalue().strip().splitlines() or ["argparse refused the arguments"]
        return {"error": lines[-1]}
    models = [server_args.model_path, server_args.speculative_draft_model_path]
    if not all(os.path.isfile(os.path.join(m, "config.json")) for m in models if m):
        return {"parsed_only": True}
    try:
        server_args.resolve_once()
        server_args.check_server_args()
        resolved = server_args.resolved_dict()
        sized = startup(server_args, sizing) if sizing else None
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {exc}".splitlines()[0]}
    refused = short(sized, sizing) if sized else None
    return {"error": refused} if refused else {"resolved": resolved, "startup": sized}


if __name__ == "__main__":
    sizing = json.loads(sys.argv[2]) if len(sys.argv) > 2 else None
    print("@@RESOLVED@@" + json.dumps(resolve(json.loads(sys.argv[1]), sizing), default=repr))
"""


class SGLangRejects(FactBase):
    """
    Why the SGLang installed in `venv` refuses `args` (argparse's or its resolution's error, or with
    `sizing`, JSON {"card_mib", "before_load_mib", "min_tokens"}, what its startup asserts once the weights
    are loaded, or a pool below the floor), or None.

    Resolution reads, and with --trust-remote-code imports, the model folder's code: it runs in a
    transient unit with `settings` (``sandbox.check_settings``: the replica unit's confinement, as its
    user), with `env`, the unit's environment, offline; without `settings`, in this shell.

    .. code:: python

        "ValueError: DDTREE currently supports only page_size == 1"
    """

    def command(self, venv: str, args: tuple[str, ...], env: tuple[tuple[str, str], ...] = (),
                settings: tuple[str, ...] = (), sizing: str = "") -> str:
        variables = (("HF_HUB_OFFLINE", "1"), *env)
        python = [f"{venv}/bin/python", "-c", RESOLVE, json.dumps(list(args)), *([sizing] if sizing else [])]
        if settings:
            # --pipe: its output is this command's; --wait: its exit status too.
            command = ["systemd-run", "--quiet", "--wait", "--pipe", "--collect", "--service-type=exec",
                       *(f"--property={setting}" for setting in settings),
                       *(f"--setenv={k}={v}" for k, v in variables), "--", *python]
        else:
            command = ["env", *(f"{k}={v}" for k, v in variables), *python]
        return f"cd / && {shlex.join(command)} 2>&1; echo \"exit=$?\""

    def process(self, output):
        for line in output:
            if line.startswith("@@RESOLVED@@"):
                result = json.loads(line[len("@@RESOLVED@@"):])
                return None if result.get("error") is None else printable(result["error"])
        errors = [line for line in output[:-1] if "error" in line.lower()]
        return printable((errors or output[-3:] or ["no output"])[-1])
