"""LAB STAND-IN only: the real SGLang has no such module.

`python -m sglang.check_args ARGS` parses ARGS like `sglang.launch_server`
and exits 0, or 2 with argparse's message, without starting anything. The
deploy's preferred check is the snippet that also works on the real package
(`ServerArgs.add_cli_args` then `parse_args`); this is a shortcut for people.
"""

import argparse
import sys

from sglang.srt.server_args import ServerArgs


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    parser.parse_args(argv)


if __name__ == "__main__":
    main(sys.argv[1:])
