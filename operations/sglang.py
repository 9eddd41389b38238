"""SGLang's command line: rendered for the pinned version, validated by the installed SGLang."""

import json
import shlex

from pyinfra.api import FactBase

from operations.deployment import Deployment

# Flag spellings that changed between SGLang releases (../shared/notes/sglang.md, checked in
# the released wheels): (first version with the new spelling, old spelling, new spelling).
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


def server_args(deployment: Deployment) -> list[str]:
    """The SGLang command line for this deployment, spelled for its SGLang version.

    The API key is not here on purpose: it never goes into process arguments
    (the host-side launcher adds it from a 0600 file).
    """
    d = deployment
    spec = d.speculative
    args = [
        "--model-path", d.target.local_dir,
        "--served-model-name", d.served_model_name,
        "--host", d.bind_address,
        "--port", str(d.port),
        "--tp-size", str(d.tp_size),
        "--mem-fraction-static", str(d.mem_fraction_static),
        "--attention-backend", d.attention_backend,
        "--speculative-algorithm", spec.algorithm,
        "--speculative-draft-model-path", d.drafter.local_dir,
        "--speculative-num-draft-tokens", str(spec.num_draft_tokens),
        "--speculative-draft-attention-backend", d.draft_attention_backend,
    ]
    if spec.draft_window_size is not None:
        args += ["--speculative-draft-window-size", str(spec.draft_window_size)]
    if spec.ddtree_budget is not None:
        args += ["--speculative-ddtree-budget", str(spec.ddtree_budget)]
    if d.enable_metrics:
        args.append("--enable-metrics")
    args += d.extra_args
    return [spell(arg, d.sglang_version) if arg.startswith("--") else arg for arg in args]


# Builds the parser the way `python -m sglang.launch_server` does, through
# ServerArgs.add_cli_args, so it holds for the real package and the lab's stand-in.
_VALIDATE = (
    "import argparse, json, sys\n"
    "from sglang.srt.server_args import ServerArgs\n"
    "parser = argparse.ArgumentParser(prog='sglang.launch_server')\n"
    "ServerArgs.add_cli_args(parser)\n"
    "parser.parse_args(json.loads(sys.argv[1]))\n"
)


class SGLangRejects(FactBase):
    """
    Why the SGLang installed in `venv` rejects `args` (its argparse error), or None if it accepts them.

    .. code:: python

        "sglang.launch_server: error: unrecognized arguments: --speculative-ddtree-budget 15"
    """

    def command(self, venv: str, args: tuple[str, ...]) -> str:
        python = f"{shlex.quote(venv)}/bin/python"
        return (f"{python} -c {shlex.quote(_VALIDATE)} {shlex.quote(json.dumps(list(args)))} 2>&1; "
                "echo \"exit=$?\"")

    def process(self, output):
        if output and output[-1] == "exit=0":
            return None
        errors = [line for line in output[:-1] if "error" in line.lower()]
        return (errors or output[-3:] or ["no output"])[-1]
