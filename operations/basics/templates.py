"""Renders the Jinja2 templates in templates/ on the controller."""

from pathlib import Path

from jinja2 import Environment, FileSystemLoader, StrictUndefined

_ENVIRONMENT = Environment(
    loader=FileSystemLoader(Path(__file__).resolve().parents[2] / "templates"),
    trim_blocks=True,
    lstrip_blocks=True,
    keep_trailing_newline=True,
    undefined=StrictUndefined,  # a missing value is an error, never an empty flag
)


def specifiers_escaped(value) -> str:
    """A value for a unit file line: systemd reads % as a specifier (%2F is an unknown one, and the
    line is dropped), %% as a literal % (systemd.unit(5), "Specifiers")."""
    return str(value).replace("%", "%%")


_ENVIRONMENT.filters["specifiers_escaped"] = specifiers_escaped


def render(template: str, **values) -> str:
    return _ENVIRONMENT.get_template(template).render(**values)
