"""Runs ON THE HOST (as root, stdlib only): units' journal lines, each with its control characters
written as escapes, so a terminal shows what a process logged instead of acting on it (an escape
sequence would clear the screen, retitle the window or rewrite the lines above it).

Usage: journal.py LINES FOLLOW UNIT...: the last LINES lines of the units' journal, then (FOLLOW 1)
every new one as it comes, until interrupted. journalctl's --all hands the text over whole (without
it, a line holding a control character is shown as "[N blob data]").
"""

import re
import subprocess
import sys

# A colour or weight (SGR: ESC [ numbers m), which smg writes around every line's level and fields even into
# the journal: dropped, as it only styles the text; every other escape sequence is shown escaped.
STYLE = re.compile(r"\x1b\[[0-9;]*m")


def escaped(line: str) -> str:
    """LINE without its colours, with every character that is not printable (a tab aside) as its Python escape."""
    return "".join(c if c.isprintable() or c == "\t" else c.encode("unicode_escape").decode()
                   for c in STYLE.sub("", line))


def main(lines: str, follow: str, units: list[str]) -> int:
    command = ["journalctl", "--no-pager", "--all", "-o", "short-iso", "-n", lines,
               *(word for unit in units for word in ("-u", unit)), *(["-f"] if follow == "1" else [])]
    journal = subprocess.Popen(command, stdout=subprocess.PIPE)
    try:
        for raw in journal.stdout:
            print(escaped(raw.decode(errors="replace").rstrip("\n")), flush=True)
    except KeyboardInterrupt:
        journal.terminate()
    return journal.wait()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2], sys.argv[3:]))
