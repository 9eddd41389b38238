"""SGLang's command line: rendered for the pinned version, validated by the installed SGLang."""

import json
import shlex

from pyinfra.api import FactBase

from operations.basics.untrusted import printable
from operations.server.config import Server
from operations.server.speculative import PAGED_BACKENDS

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


def value(args: list[str], flag: str) -> str | None:
    """The value `flag` takes on an SGLang command line as argparse reads it: the last of `FLAG VALUE` and
    `FLAG=VALUE`; None where it is not given."""
    found = None
    for i, arg in enumerate(args):
        if arg == flag and i + 1 < len(args):
            found = args[i + 1]
        elif arg.startswith(f"{flag}="):
            found = arg[len(flag) + 1:]
    return found


def server_args(server: Server) -> list[str]:
    """The SGLang command line for this server, spelled for its SGLang version.

    The API key is not here on purpose: it never goes into process arguments
    (the host-side launcher adds it from a 0600 file).
    """
    d = server
    args = [
        "--model-path", d.engine.model_dir,
        "--served-model-name", d.engine.served_model_name,
        "--host", d.engine.service.bind_address,
        "--port", str(d.port),
        "--nccl-port", str(d.nccl_port),
        "--tp-size", str(d.engine.tp_size),
        "--mem-fraction-static", str(d.engine.mem_fraction_static),
        "--attention-backend", d.engine.attention_backend,
        *d.engine.speculative.flags(d.engine.draft_model_dir, d.engine.draft_attention_backend),
    ]
    if d.engine.layout.context_length is not None:
        args += ["--context-length", str(d.engine.layout.context_length)]
    if d.engine.service.enable_metrics:
        args.append("--enable-metrics")
    args += d.engine.node_args
    args += d.engine.extra_args
    return [spell(arg, d.engine.sglang_version) if arg.startswith("--") else arg for arg in args]


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


def rendered_violations(server: Server) -> list[str]:
    """The deploy's rules of the server's algorithm (operations/server/speculative.py) over what it renders
    (page size as asked; SGLang's resolution may still raise it, which the host's own check sees)."""
    d = server
    asked = value(list(d.engine.extra_args), "--page-size")
    page_size = int(asked) if asked is not None else None
    if d.engine.attention_backend in PAGED_BACKENDS:
        page_size = None  # they move any page size above one, whatever was asked
    return d.engine.speculative.entry.violations(page_size, d.engine.attention_backend, d.engine.speculative.tree_size,
                                          d.engine.speculative.num_draft_tokens)
