"""A host's unit journals (logs.py): which units a host's data gives it, and the command that prints them."""

from deployment import knobs
from operations.basics.host_programs import inline
from operations.status import HostView

DEFAULT_LINES = 100
MOST_LINES = 100_000


def units(view: HostView, replica: str | None) -> list[str]:
    """The units whose journal logs.py shows on the host: `replica` (a replica's unit or the gateway's) if
    the host's data gives it one of that name, else every unit its data gives it. Raises BadHostData
    for any other value, naming the units it has."""
    mine = view.units
    if replica is None:
        return mine
    # Only a name equal to one of the host's units (each built from validated data) reaches the shell.
    if replica not in mine:
        raise knobs.refused("replica", replica, f"use one of {', '.join(mine) or 'none'}",
                            wrong=f"is no unit of {view.name}")
    return [replica]


def command(unit_names: list[str], lines: int, follow: bool) -> str:
    """The shell command printing the units' journal, control characters escaped (host_scripts/journal.py)."""
    return inline("journal", str(lines), "1" if follow else "0", *unit_names)
