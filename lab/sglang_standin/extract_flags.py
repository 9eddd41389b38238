"""Extract the REAL SGLang 0.5.23 CLI flags for the lab's SGLang stand-in.

Run from the repo root with the controller venv:
    python lab/sglang_standin/extract_flags.py [OUT_DIR]
It re-runs itself inside the real-parser env (tests/sglang_real.py builds it),
dumps every argparse action of `ServerArgs.add_cli_args` to
sglang/flags_0_5_23.json, and writes sglang/flags_0_5_23_ddtree.json: the same
list plus the flags of DDTree PR #29907, which no release has.
"""

import argparse
import json
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
OUT_DIR = HERE / "sglang"
VERSION = "0.5.23"

# PR #29907 adds one CLI flag (its other knobs are env settings); DDTREE itself
# is only a value of the free-string --speculative-algorithm.
DDTREE_FLAGS = [
    {
        "option_strings": ["--speculative-ddtree-budget"],
        "dest": "speculative_ddtree_budget",
        "nargs": None,
        "type": "int",
        "choices": None,
        "default": None,
        "const": None,
        "action": "_StoreAction",
        "required": False,
    }
]


def choices_of(action: argparse.Action) -> list | None:
    """The choices in a stable order: some are sets (SAMPLING_BACKEND_CHOICES), whose order
    changes with Python's hash seed from one run to the next."""
    if action.choices is None:
        return None
    if isinstance(action.choices, (set, frozenset)):
        return sorted(action.choices)
    return list(action.choices)


def dump_actions() -> list[dict]:
    """Runs inside the real env: every action of the real parser."""
    # Running this file puts its folder, which holds the stand-in, first on
    # sys.path: drop it so `sglang` is the real package.
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    actions = []
    for a in parser._actions:
        if isinstance(a, argparse._HelpAction):
            continue  # every ArgumentParser adds its own -h
        entry = {
            "option_strings": a.option_strings,
            "dest": a.dest,
            "nargs": a.nargs,
            "type": getattr(a.type, "__name__", None),
            "choices": choices_of(a),
            "default": a.default,
            "const": a.const,
            "action": type(a).__name__,
            "required": a.required,
        }
        if hasattr(a, "const_value"):  # DeprecatedStoreConstAction
            entry["const_value"] = a.const_value
        actions.append(entry)
    return actions


def write(out_dir: Path, name: str, actions: list[dict], source: str) -> None:
    # One action a line, so a re-extraction diffs flag by flag.
    lines = ",\n".join("  " + json.dumps(a, default=repr) for a in actions)
    head = json.dumps({"sglang_version": VERSION, "source": source})[:-1]
    (out_dir / name).write_text(f'{head}, "actions": [\n{lines}\n]}}\n')


def main() -> None:
    if "--dump" in sys.argv:
        print(json.dumps(dump_actions(), default=repr))
        return
    sys.path.insert(0, str(HERE.parent.parent))
    from tests.sglang_real import real_sglang_python

    out = subprocess.run(
        [str(real_sglang_python()), __file__, "--dump"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    actions = json.loads(out.splitlines()[-1])
    out_dir = Path(sys.argv[1]) if len(sys.argv) > 1 else OUT_DIR  # default: the stand-in's own
    write(
        out_dir,
        "flags_0_5_23.json",
        actions,
        f"sglang=={VERSION} ServerArgs.add_cli_args (extracted by extract_flags.py)",
    )
    write(
        out_dir,
        "flags_0_5_23_ddtree.json",
        actions + DDTREE_FLAGS,
        f"sglang=={VERSION} plus DDTree PR #29907 flags (extract_flags.py)",
    )
    print(f"{len(actions)} flags from sglang=={VERSION} written to {out_dir}")


if __name__ == "__main__":
    main()
