"""SGLang's command line: rendered for the pinned version, validated by the installed SGLang."""

import json
import shlex

from pyinfra.api import FactBase

from operations.basics.untrusted import printable
from operations.server.config import Server

# Flag spellings that changed between SGLang releases (checked in the released wheels): (first version with the new spelling, old spelling, new spelling).
RENAMED_FLAGS = [
    ((0, 5, 13), "--speculative-dflash-draft-window-size", "--speculative-draft-window-size"),
    ((0, 5, 16), "--mamba-scheduler-strategy", "--mamba-radix-cache-strategy"),
]


def version_tuple(version: str) -> tuple[int, ...]:
    """'0.5.23+lab' -> (0, 5, 23); 'post' and local labels do not change flag spellings."""
    release = version.split("+")[0].split(".post")[0]
    return tuple(int(part) for part in release.split(".") if part.isdigit())


def spell(flag: str, version: str) -> str:
    """The spelling of `flag` (old or new) that SGLang `version` accepts."""
    installed = version_tuple(version)
    for since, old, new in RENAMED_FLAGS:
        if flag in (old, new):
            return new if installed >= since else old
    return flag


def server_args(server: Server) -> list[str]:
    """The SGLang command line for this server, spelled for its SGLang version.

    The API key is not here on purpose: it never goes into process arguments
    (the host-side launcher adds it from a 0600 file).
    """
    d = server
    spec = d.speculative
    args = [
        "--model-path", d.model_dir,
        "--served-model-name", d.served_model_name,
        "--host", d.bind_address,
        "--port", str(d.port),
        "--nccl-port", str(d.nccl_port),
        "--tp-size", str(d.tp_size),
        "--mem-fraction-static", str(d.mem_fraction_static),
        "--attention-backend", d.attention_backend,
        "--speculative-algorithm", spec.algorithm,
        "--speculative-draft-model-path", d.draft_model_dir,
        "--speculative-num-draft-tokens", str(spec.num_draft_tokens),
        "--speculative-draft-attention-backend", d.draft_attention_backend,
    ]
    if spec.draft_window_size is not None:
        args += ["--speculative-draft-window-size", str(spec.draft_window_size)]
    if spec.ddtree_budget is not None:
        args += ["--speculative-ddtree-budget", str(spec.ddtree_budget)]
    if d.enable_metrics:
        args.append("--enable-metrics")
    args += d.node_args
    args += d.extra_args
    return [spell(arg, d.sglang_version) if arg.startswith("--") else arg for arg in args]


# DDTree (open PR #29907, in no release): its own refusals, which the deploy checks itself
# because the released SGLang it validates with does not know DDTree.
# Its verify needs one-token KV pages ("DDTREE currently supports only page_size == 1"),
# so the target attention backend must allow page size 1: trtllm_mha moves any other page size to
# one of 16/32/64/128 and refuses tree (topk > 1) speculation, trtllm_mla forces 32/64 (SGLang 0.5.23
# srt/arg_groups/overrides.py, _mla_backend_page_constraints, run before the speculative hook).
# A budget <= draft tokens - 1 (the PR's default) is spine mode: one chain, verified as DFLASH
# verifies it; only a larger budget builds a tree (speculative/ddtree_worker.py at 93e9850e4), and
# only the tree verify needs the triton target backend (_handle_ddtree).
DDTREE_PAGE_SIZE = 1
DDTREE_TREE_BACKENDS = ("triton",)  # PR #29907 since 93e9850e4: the full-tree verify is triton-only
# A budget is the number of tree nodes verified per step: at least one; at most 1024, the
# largest budget the DDTree paper's reference code runs (liranringel/ddtree benchmark.py).
DDTREE_BUDGET_RANGE = (1, 1024)


def ddtree_builds_tree(num_draft_tokens: int, budget: int | None) -> bool:
    """Whether DDTree verifies a tree (budget > draft tokens - 1) rather than its spine, one chain; no
    budget is the PR's default, draft tokens - 1."""
    return budget is not None and budget > num_draft_tokens - 1


# Target backends that force KV pages above one token (0.5.23 srt/arg_groups/overrides.py,
# _mla_backend_page_constraints), which DDTree cannot run on.
PAGED_BACKENDS = ("trtllm_mha", "trtllm_mla")


def ddtree_target_backend(backend: str, num_draft_tokens: int, budget: int | None) -> str:
    """The target backend a DDTree server of this budget runs in place of `backend`: `backend` where it
    allows one-token pages and the mode allows it (any in spine mode), else the tree verify's triton."""
    if backend in PAGED_BACKENDS or (ddtree_builds_tree(num_draft_tokens, budget)
                                     and backend not in DDTREE_TREE_BACKENDS):
        return DDTREE_TREE_BACKENDS[0]
    return backend


def ddtree_violations(page_size: int | None, attention_backend: str | None, budget: int | None,
                      num_draft_tokens: int) -> list[str]:
    """Why a DDTree server would refuse these (resolved) settings; [] if it accepts them."""
    problems = []
    if page_size != DDTREE_PAGE_SIZE:
        problems.append(f"DDTREE currently supports only page_size == 1 (page size "
                        f"{page_size if page_size is not None else f'set by {attention_backend}'})")
    if ddtree_builds_tree(num_draft_tokens, budget) and attention_backend not in DDTREE_TREE_BACKENDS:
        problems.append(f"DDTREE tree mode (budget {budget} > draft tokens - 1 = {num_draft_tokens - 1}) needs "
                        f"the target attention backend {', '.join(DDTREE_TREE_BACKENDS)}, not {attention_backend}")
    low, high = DDTREE_BUDGET_RANGE
    if budget is not None and not low <= budget <= high:
        problems.append(f"DDTREE budget must be within [{low}, {high}], not {budget}")
    return problems


# What the host runs to validate a command line: SGLang's own construction, as
# `sglang serve` does it (prepare_server_args: argparse), then its full resolution
# (ServerArgs.resolve_once: the post-init hooks that reject or rewrite combinations
# argparse accepts) and the checks the engine runs before it launches anything
# (check_server_args: e.g. a TP size that the nodes do not divide), without loading the
# model. On a GPU host it sees the real GPU.
# Before the weights are on disk (a first preflight) only argparse can run: the
# hooks read the model's config. The lab's SGLang stand-in answers the same calls,
# and tests/sglang_real.py runs this very text in the real SGLang 0.5.23.
RESOLVE = r"""
import contextlib, io, json, os, sys
from sglang.srt.server_args import prepare_server_args


def resolve(argv):
    # What SGLang makes of argv: {"resolved": {...}} or {"error": "why it refuses"}.
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
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {exc}".splitlines()[0]}
    return {"resolved": server_args.resolved_dict()}


if __name__ == "__main__":
    print("@@RESOLVED@@" + json.dumps(resolve(json.loads(sys.argv[1])), default=repr))
"""


class SGLangRejects(FactBase):
    """
    Why the SGLang installed in `venv` refuses `args` (argparse's or its resolution's error), or None.

    Resolution reads, and with --trust-remote-code imports, the model folder's code: it runs in a
    transient unit with `settings` (``sandbox.check_settings``: the replica unit's confinement, as its
    user), with `env`, the unit's environment, offline; without `settings`, in this shell.

    .. code:: python

        "ValueError: DDTREE currently supports only page_size == 1"
    """

    def command(self, venv: str, args: tuple[str, ...], env: tuple[tuple[str, str], ...] = (),
                settings: tuple[str, ...] = ()) -> str:
        variables = (("HF_HUB_OFFLINE", "1"), *env)
        python = [f"{venv}/bin/python", "-c", RESOLVE, json.dumps(list(args))]
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


def rendered_ddtree_violations(server: Server) -> list[str]:
    """The deploy's DDTree rules over what it renders (page size as asked; SGLang's resolution may
    still raise it, which the host's own check sees); [] for other algorithms."""
    d = server
    if d.speculative.algorithm != "DDTREE":
        return []
    args = list(d.extra_args)
    page_size = int(args[args.index("--page-size") + 1]) if "--page-size" in args else None
    if d.attention_backend in PAGED_BACKENDS:
        page_size = None  # they move any page size above one, whatever was asked
    return ddtree_violations(page_size, d.attention_backend, d.speculative.ddtree_budget,
                             d.speculative.num_draft_tokens)
