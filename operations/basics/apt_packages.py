"""Debian packages on a host: what apt can install, and installing with the lists updated only when
apt does not know a package yet (an `apt-get update` costs seconds on every run otherwise)."""

from pyinfra import host
from pyinfra.api import FactBase
from pyinfra.operations import apt
from typing_extensions import override


class AptVersions(FactBase):
    """
    Returns the versions apt can install of each package, from the package lists as they are
    (``apt-cache madison``); a package apt does not know is missing.

    .. code:: python

        {"nvidia-open-580": ["580.95.05-1", "580.82.07-1"]}
    """

    default = dict

    @override
    def command(self, packages: tuple[str, ...]) -> str:
        return f"apt-cache madison {' '.join(packages)} 2>/dev/null || true"

    @override
    def process(self, output: list[str]) -> dict[str, list[str]]:
        versions: dict[str, list[str]] = {}
        for line in output:
            cells = [cell.strip() for cell in line.split("|")]
            if len(cells) == 3 and cells[2].endswith("Packages"):
                versions.setdefault(cells[0], []).append(cells[1])
        return versions


def install(names: list[str]):
    """The commands (an operation's body) installing `names`, updating the package lists first only if
    apt does not know one of them."""
    known = host.get_fact(AptVersions, packages=tuple(names))
    if any(name not in known for name in names):
        yield from apt.update._inner()
    yield from apt.packages._inner(packages=names, no_recommends=True)
