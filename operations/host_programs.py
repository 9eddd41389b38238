"""Host-side programs from host_scripts/ run inline (`python3 -c`), where nothing should be uploaded.

A program imports the shared modules it needs (weights_manifest) by name, as it does when
uploaded next to them; inline, each such module's source travels in front of the program and
is registered under that name first.
"""

import re
import shlex
from pathlib import Path

HOST_SCRIPTS = Path(__file__).resolve().parent / "host_scripts"
SHARED_MODULES = ("weights_manifest",)

_LOADER = ("import sys as _sys, types as _types\n"
           "_module = _sys.modules[{name!r}] = _types.ModuleType({name!r})\n"
           "exec({source!r}, _module.__dict__)\n")


def program(name: str) -> str:
    """The Python source that runs host_scripts/NAME.py with its shared modules loaded."""
    source = (HOST_SCRIPTS / f"{name}.py").read_text()
    loaders = [_LOADER.format(name=module, source=(HOST_SCRIPTS / f"{module}.py").read_text())
               for module in SHARED_MODULES if re.search(rf"^(import|from) {module}\b", source, re.M)]
    return "".join(loaders) + source


def inline(name: str, *args: str, user: str | None = None) -> str:
    """A shell command running host_scripts/NAME.py with ARGS; as USER (through runuser) when given."""
    as_user = f"runuser -u {shlex.quote(user)} -- " if user else ""
    return f"{as_user}python3 -c {shlex.quote(program(name))} {' '.join(map(shlex.quote, args))}".rstrip()
