"""`python -m tools.gpu classify DIR`: print one JSON object describing the captured host.
`python -m tools.gpu capture OUTDIR [--class CLASS] [--judge-only]`: see tools/gpu/capture.py."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from . import capture
from .classify import classify_dir


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.gpu")
    commands = parser.add_subparsers(dest="command", required=True)
    classify = commands.add_parser(
        "classify",
        help="classify a host from nvidia-smi captures "
        "(topo.txt, query.csv, smi_q.txt or q.txt, q.xml, smi.txt)",
    )
    classify.add_argument("capture_dir", metavar="DIR", type=Path)
    take = commands.add_parser("capture", help="on a GPU host: capture nvidia-smi, the facts and the smoke test")
    take.add_argument("capture_dir", metavar="OUTDIR", type=Path)
    take.add_argument("--class", dest="class_name", default="b200_nvlink", help="the class to check against")
    take.add_argument("--judge-only", action="store_true", help="only (re)write judged.json from the folder's files")
    args = parser.parse_args(argv)
    if args.command == "capture":
        if args.judge_only:
            judged = capture.judge(args.capture_dir, args.class_name)
            (args.capture_dir / "judged.json").write_text(json.dumps(judged, indent=2) + "\n")
        else:
            judged = capture.take(args.capture_dir, args.class_name)
        print(json.dumps(judged, indent=2))
        return 0
    try:
        result = classify_dir(args.capture_dir)
    except (FileNotFoundError, NotADirectoryError) as error:
        print(f"classify: {error}", file=sys.stderr)
        return 1
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
