"""The README is the contract a newcomer reads: short, showing the two commands and a plot, and naming
only commands, files and pages that exist."""

import re
import shlex
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
README = (REPO / "README.md").read_text()
MAKEFILE = (REPO / "Makefile").read_text()

# A path of the checkout as the README writes it: a known top-level entry, then path characters.
TOP_LEVEL = sorted(p.name for p in REPO.iterdir() if not p.name.startswith("."))
PATH = re.compile(r"(?<![\w/.~-])((?:%s)(?:/[\w.*=-]+)*/?)" % "|".join(map(re.escape, TOP_LEVEL)))


def code_blocks(text: str) -> list[str]:
    return re.findall(r"^```[a-z]*\n(.*?)^```", text, flags=re.M | re.S)


def test_the_readme_is_short_and_shows_the_two_commands_and_a_plot():
    assert len(README.splitlines()) <= 300
    commands = "\n".join(code_blocks(README))
    assert re.search(r"^make demo\b", commands, re.M) and re.search(r"^make test\b", commands, re.M)
    images = re.findall(r"!\[[^\]]*\]\(([^)]+\.png)\)", README)
    assert images and all((REPO / image).is_file() for image in images), images
    # The plot is the stand-in's: the README says so next to it.
    assert "stand-in" in README.split(images[0])[1][:400]


def test_every_page_the_readme_links_exists():
    links = [link for link in re.findall(r"\]\(([^)#]+)\)", README) if "://" not in link]
    assert links
    missing = [link for link in links if not (REPO / link).exists()]
    assert not missing, missing


def test_every_path_the_readme_names_exists():
    named = {match.rstrip("/") for match in PATH.findall(README)}
    assert {"deploy.py", "pin.py", "inventory/ct200.py", "tests/deployed"} <= named
    missing = sorted(path for path in named if not (REPO / path).exists() and "*" not in path)
    assert not missing, missing


def test_every_command_in_the_readme_runs_something_that_exists():
    targets = set(re.findall(r"^([\w-]+):", MAKEFILE, flags=re.M))
    for block in code_blocks(README):
        for line in block.splitlines():
            line = line.split("#")[0].strip().rstrip("\\").strip()
            if not line or line.startswith(("export ", "mkdir ")):
                continue
            words = [w for w in shlex.split(line) if "=" not in w or w.startswith("-")]
            program, args = words[0], words[1:]
            if program == "make":
                assert args[0] in targets, line
            elif program in ("python", "python3") and args[0].endswith(".py"):
                assert (REPO / args[0]).is_file(), line
            elif program == "pyinfra":
                files = [a for a in args if a.endswith(".py")]
                assert len(files) == 2 and all((REPO / f).is_file() for f in files), line
            elif program == "pytest":
                assert (REPO / args[0]).exists(), line
