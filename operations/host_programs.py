"""Host-side programs from host_scripts/ run inline (`python3 -c`), where nothing should be uploaded.

A program imports the shared modules it needs (weights_manifest) by name, as it does when
uploaded next to them; inline, each such module's source travels in front of the program and
is registered under that name first.
"""

import re
import shlex
from pathlib import Path

HOST_SCRIPTS = Path(__file__).resolve().parent / "host_scripts"

_LOADER = ("import sys as _sys, types as _types\n"
           "_module = _sys.modules[{name!r}] = _types.ModuleType({name!r})\n"
           "exec({source!r}, _module.__dict__)\n")


def _imported(source: str) -> list[str]:
    """The host_scripts modules SOURCE imports."""
    return [module for module in re.findall(r"^(?:import|from) (\w+)", source, re.M)
            if (HOST_SCRIPTS / f"{module}.py").is_file()]


def program(name: str) -> str:
    """The Python source that runs host_scripts/NAME.py with the host_scripts modules it imports
    (and those they import) loaded first."""
    source = (HOST_SCRIPTS / f"{name}.py").read_text()
    order: list[str] = []

    def visit(module: str) -> None:
        if module not in order:
            for dependency in _imported((HOST_SCRIPTS / f"{module}.py").read_text()):
                visit(dependency)
            order.append(module)

    for module in _imported(source):
        visit(module)
    return "".join(_LOADER.format(name=module, source=(HOST_SCRIPTS / f"{module}.py").read_text())
                   for module in order) + source


def inline(name: str, *args: str, user: str | None = None) -> str:
    """A shell command running host_scripts/NAME.py with ARGS; as USER (through runuser) when given."""
    as_user = f"runuser -u {shlex.quote(user)} -- " if user else ""
    return f"{as_user}python3 -c {shlex.quote(program(name))} {' '.join(map(shlex.quote, args))}".rstrip()
