"""The programs that run ON THE HOST: each subject keeps its own in operations/<subject>/host_scripts/.

They are plain Python 3 (stdlib only). Some are uploaded to the host (`paths`); others run inline
(`python3 -c`, `inline`), where nothing should be uploaded. A program imports the modules it shares
with others (weights_manifest) by name, as it does when uploaded next to them; inline, each such
module's source travels in front of the program and is registered under that name first.
"""

import re
import shlex
from pathlib import Path

OPERATIONS = Path(__file__).resolve().parent.parent


def _discover() -> dict[str, Path]:
    """Every subject's host programs by name: one name, one program, whatever subject holds it."""
    found: dict[str, Path] = {}
    for path in sorted(OPERATIONS.glob("*/host_scripts/*.py")):
        if path.stem in found:
            raise RuntimeError(f"two host programs named {path.stem}: {found[path.stem]} and {path}")
        found[path.stem] = path
    return found


HOST_SCRIPTS = _discover()

_LOADER = ("import sys as _sys, types as _types\n"
           "_module = _sys.modules[{name!r}] = _types.ModuleType({name!r})\n"
           "exec({source!r}, _module.__dict__)\n")


def of_subject(subject: str) -> dict[str, Path]:
    """The host programs operations/SUBJECT/host_scripts/ holds, by name, and those they import
    (uploaded beside them, where they import them by name)."""
    found = {name: path for name, path in HOST_SCRIPTS.items() if path.parent.parent.name == subject}
    pending = list(found)
    while pending:
        for module in _imported(HOST_SCRIPTS[pending.pop()].read_text()):
            if module not in found:
                found[module] = HOST_SCRIPTS[module]
                pending.append(module)
    return found


def _imported(source: str) -> list[str]:
    """The host programs SOURCE imports."""
    return [module for module in re.findall(r"^(?:import|from) (\w+)", source, re.M) if module in HOST_SCRIPTS]


def program(name: str, also: tuple[str, ...] = ()) -> str:
    """The Python source that runs the host program NAME with the host programs it imports
    (and those they import) loaded first, and the programs `also` names (which NAME imports by name
    at run time)."""
    source = HOST_SCRIPTS[name].read_text()
    order: list[str] = []

    def visit(module: str) -> None:
        if module not in order:
            for dependency in _imported(HOST_SCRIPTS[module].read_text()):
                visit(dependency)
            order.append(module)

    for module in (*_imported(source), *also):
        visit(module)
    return "".join(_LOADER.format(name=module, source=HOST_SCRIPTS[module].read_text())
                   for module in order) + source


def inline(name: str, *args: str, user: str | None = None, also: tuple[str, ...] = ()) -> str:
    """A shell command running the host program NAME with ARGS; as USER (through runuser) when given;
    with the programs `also` names loaded (``program``)."""
    as_user = f"runuser -u {shlex.quote(user)} -- " if user else ""
    return f"{as_user}python3 -c {shlex.quote(program(name, also))} {' '.join(map(shlex.quote, args))}".rstrip()

