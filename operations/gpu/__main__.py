"""`python -m operations.gpu classify DIR`: print one JSON object describing the captured host."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .classify import classify_dir


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m operations.gpu")
    commands = parser.add_subparsers(dest="command", required=True)
    classify = commands.add_parser(
        "classify",
        help="classify a host from nvidia-smi captures "
        "(topo.txt, query.csv, smi_q.txt or q.txt, q.xml, smi.txt)",
    )
    classify.add_argument("capture_dir", metavar="DIR", type=Path)
    args = parser.parse_args(argv)
    try:
        result = classify_dir(args.capture_dir)
    except (FileNotFoundError, NotADirectoryError) as error:
        print(f"classify: {error}", file=sys.stderr)
        return 1
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
