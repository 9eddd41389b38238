"""Writes docs/configuration.md, the reference page of every knob, from the declarations in deployment/schema.py:
`python -m tools.configuration_page` after changing a knob (tests/unit/test_schema.py says when it is stale)."""

import os
import runpy
import sys
from pathlib import Path

from pyinfra.api import Inventory
from pyinfra.context import ctx_inventory

from deployment import schema

REPO = Path(__file__).resolve().parents[1]
PAGE = REPO / "docs" / "configuration.md"


def _group_files() -> dict[str, dict]:
    """Each shipped group file's values (all, gateway and every class), no site applied."""
    found = {}
    site = os.environ.pop("SPECFLEET_SITE", None)  # the shipped defaults, not this machine's site
    try:
        with ctx_inventory.use(Inventory(([], {}))):  # a group file may read the inventory, as pyinfra lets it
            for path in sorted((REPO / "group_data").glob("*.py")):
                found[path.stem] = runpy.run_path(str(path))
    finally:
        if site is not None:
            os.environ["SPECFLEET_SITE"] = site
    return found


def _default(knob: schema.Knob, group_files: dict[str, dict]) -> str:
    if knob.group == schema._CLASS:
        return "per class (group_data/<class>.py)"
    if knob.group and knob.name in group_files.get(knob.group, {}):
        value = group_files[knob.group][knob.name]
    elif knob.group or knob.default is None:
        return "None"  # no file sets it: the help says what None means
    else:
        value = knob.default
    if knob.type == "dict" or isinstance(value, dict):
        return f"see group_data/{knob.group}.py"
    return f"`{value!r}`"


def page() -> str:
    """docs/configuration.md, written from schema.KNOBS."""
    group_files = _group_files()
    lines = ["# Configuration: every knob", "",
             "Generated from `deployment/schema.py` by `python -m tools.configuration_page`; do not edit by hand.", "",
             "A knob is set, each layer over the one before: shipped group data (`group_data/<group>.py`), your "
             "site's (`SPECFLEET_SITE/group_data/<group>.py`), an inventory host's data, then `--data key=value`. "
             "A key no knob has, or one set where its layers do not allow, stops the run before anything changes, "
             "in one line naming it, where it was set and the nearest knob, once pyinfra has reached a host: pyinfra "
             "runs deploy.py only for the hosts it connects to, so where none answers it prints its own `Could not "
             "connect` alone. pyinfra's own keys (`ssh_*`, `_sudo`, "
             "...) are pyinfra's and pass. \"may be set in\": any of those layers, or the ones named. What a host "
             "serves (`profile`, `profiles`, `deployments`, `layouts`) a deploy and rollout.py refuse from `--data`, "
             "which would last one run: status.py, `pytest tests/deployed` and the gateways read the group data.", ""]
    for subject, title in schema.SECTIONS.items():
        lines += [f"## {title}", "", "| knob | type | default | may be set in | what it does |",
                  "|---|---|---|---|---|"]
        lines += [f"| `{k.name}` | {k.type} | {_default(k, group_files)} | "
                  f"{'any' if k.layers == schema.LAYERS else ', '.join(k.layers)} | {k.help} |"
                  for k in schema.KNOBS if k.subject == subject]
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    PAGE.write_text(page())
    print(f"wrote {PAGE.relative_to(REPO)}", file=sys.stderr)
