"""SGLang's command line for a server, rendered for its pinned version (operations/server/flags.py has the
installed SGLang validate it on the host)."""

from deployment.server.config import Server
from deployment.server.speculative import PAGED_BACKENDS

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


def rendered_violations(server: Server) -> list[str]:
    """The deploy's rules of the server's algorithm (deployment/server/speculative.py) over what it renders
    (page size as asked, else one token: 0.5.23 arg_groups/overrides.py _page_size_default on CUDA, the
    model overrides setting none where the profile names its backend; SGLang's resolution may still raise
    it, which the host's own check sees)."""
    d = server
    asked = value(list(d.engine.extra_args), "--page-size")
    page_size = int(asked) if asked is not None else 1
    if d.engine.attention_backend in PAGED_BACKENDS:
        page_size = None  # they move any page size above one, whatever was asked
    spec = d.engine.speculative
    return spec.entry.violations(page_size, d.engine.attention_backend, spec.tree_size, spec.num_draft_tokens,
                                 spec.values)
