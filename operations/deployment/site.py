"""The user's site directory (`SPECFLEET_SITE`): their group data and pins, kept outside this checkout so that
`git pull` or an upgrade never meets a file they edited.

    SITE/group_data/<group>.py   overrides group_data/<group>.py (all, a class, gateway), key by key
    SITE/pins.json               the commits `python pin.py` resolved moving revisions to
    SITE/tuned/<class>/<profile>.json   the settings tune.py measured best (operations/deployment/tuned.py)
    SITE/locks/NAME==VERSION.txt   the hash locks of the site's own pins (operations/python/locks/compile.py)

A site group file runs with the shipped file's values as its starting globals, so it may set a key
(`hf_endpoint = "https://hub.example"`) or change part of one (`mirrors["repos"]["moonshotai/Kimi-K2.6"] =
"mirror/Kimi-K2.6"`); every public name it leaves is the group's value. Each shipped group file ends by
calling `overrides`, so the site applies to whatever loads group data as pyinfra does: the deploy,
bench.py, rollout.py, pin.py and `pytest tests/deployed`. Without SPECFLEET_SITE nothing changes.
"""

import copy
import difflib
import json
import runpy
import traceback
import types
from pathlib import Path

from operations import schema
from operations.basics.site_directory import CHECKOUT, SITE_ENV, directory  # noqa: F401 (this module's API too)

PINS_FILE = "pins.json"
TUNED_DIR = "tuned"


def _public(values: dict) -> dict:
    return {key: value for key, value in values.items()
            if not key.startswith("_") and not isinstance(value, types.ModuleType)}


def overrides(group_file: str, ours: dict) -> dict:
    """The group's values after SITE/group_data/<group>.py (the group named by `group_file`'s name) ran
    over `ours` (the shipped file's globals); `ours`' own values without a site or such a file."""
    site = directory()
    if site is None:
        return {}
    _no_stray_files(site, Path(group_file).parent)
    path = site / "group_data" / Path(group_file).name
    if not path.is_file():
        return {}
    shipped = _public(ours)
    try:
        found = _public(runpy.run_path(str(path), init_globals=copy.deepcopy(shipped)))
    except Exception as error:  # the site's own code: said in one line, as a knob's value is
        line = next((f" (line {frame.lineno})" for frame in reversed(traceback.extract_tb(error.__traceback__))
                     if frame.filename == str(path)), "")
        if isinstance(error, SyntaxError):
            line = f" (line {error.lineno})"
        raise SystemExit(f"{path}{line}: {type(error).__name__}: {error}: fix it (it runs as Python over "
                         f"group_data/{path.name}), or move it out of {site}/group_data") from None
    schema.check({key: value for key, value in found.items() if key not in shipped or value != shipped[key]},
                 schema.SITE, str(path))
    return found


def _no_stray_files(site: Path, shipped: Path) -> None:
    """A site group file overriding no shipped one would be read by nothing: stop, naming the group meant."""
    groups = sorted(path.stem for path in shipped.glob("*.py"))
    for path in sorted((site / "group_data").glob("*.py")):
        if path.stem not in groups:
            near = difflib.get_close_matches(path.stem, groups, n=1)
            raise SystemExit(f"{path} overrides no group of specfleet{f' (did you mean {near[0]}.py?)' if near else ''}: "
                             f"a site group file is named after one of group_data/ ({', '.join(groups)})")


def pins_path() -> Path | None:
    site = directory()
    return site / PINS_FILE if site else None


def pins() -> dict:
    """SITE/pins.json as written by pin.py: {"repos": {"REPO@REVISION": COMMIT}, "git": {"URL@REF": COMMIT}};
    empty without a site or a pin."""
    path = pins_path()
    if path is None or not path.is_file():
        return {"repos": {}, "git": {}}
    try:
        found = json.loads(path.read_text())
        return {"repos": dict(found.get("repos", {})), "git": dict(found.get("git", {}))}
    except (ValueError, TypeError, AttributeError) as error:
        raise SystemExit(f"{path} is not what pin.py writes ({error}): restore it from your site's history, or "
                         f"move it away (mv {path} {path}.bad) and run `python pin.py INVENTORY` to write it "
                         "anew") from None


def write_pins(found: dict) -> Path:
    """Write `found` (the shape `pins()` returns) to SITE/pins.json, through a temporary file renamed into place."""
    path = pins_path()
    if path is None:
        raise SystemExit(f"pin.py writes SITE/{PINS_FILE}: export {SITE_ENV}=DIR (your site directory, "
                         "outside this checkout)")
    temporary = path.with_name(f".{PINS_FILE}.tmp")
    temporary.write_text(json.dumps({"repos": dict(sorted(found["repos"].items())),
                                     "git": dict(sorted(found["git"].items()))}, indent=2) + "\n")
    temporary.replace(path)
    return path


def tuned(class_file: str) -> dict:
    """The tuned files of the class `class_file` (a group_data/<class>.py) names, as tune.py wrote them:
    {PROFILE: {"path": SITE/tuned/<class>/<profile>.json, "found": its JSON}}; empty without a site. Their
    settings are checked where the deploy reads them (operations/deployment/tuned.py)."""
    site = directory()
    if site is None:
        return {}
    found = {}
    for path in sorted((site / TUNED_DIR / Path(class_file).stem).glob("*.json")):
        try:
            found[path.stem] = {"path": str(path), "found": json.loads(path.read_text())}
        except (OSError, ValueError) as error:
            raise SystemExit(f"{path} is not what tune.py writes ({type(error).__name__}: {error}): run tune.py "
                             f"again, or move it away (mv {path} {path}.bad)") from None
    return found


def tuned_path(host_class: str, profile: str) -> Path:
    """Where tune.py writes the settings it measured best for `profile` on `host_class`."""
    site = directory()
    if site is None:
        raise SystemExit(f"tune.py writes SITE/{TUNED_DIR}/{host_class}/{profile}.json: export {SITE_ENV}=DIR "
                         "(your site directory, outside this checkout)")
    return site / TUNED_DIR / host_class / f"{profile}.json"


def write_tuned(path: Path, document: dict) -> Path:
    """Write a tuned file (operations/deployment/tuned.py document()) through a temporary file renamed into place."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.tmp")
    temporary.write_text(json.dumps(document, indent=2) + "\n")
    temporary.replace(path)
    return path
