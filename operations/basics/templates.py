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


def render(template: str, **values) -> str:
    return _ENVIRONMENT.get_template(template).render(**values)
