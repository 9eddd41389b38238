"""The user's site directory (`SPECFLEET_SITE`): their group data and pins, kept outside this checkout so that
`git pull` or an upgrade never meets a file they edited.

    SITE/group_data/<group>.py   overrides group_data/<group>.py (all, a class, gateway), key by key
    SITE/group_data/<class>.py   a class of the site's own, where it declares `expected_gpus` and no shipped
                                 group has its name
    SITE/pins.json               the commits `python pin.py` resolved moving revisions to
    SITE/tuned/<class>/<profile>.json   the settings tune.py measured best (deployment/tuned.py)
    SITE/locks/NAME==VERSION.txt   the hash locks of the site's own pins (operations/python/locks/compile.py)

A site group file runs with the shipped file's values as its starting globals, so it may set a key
(`hf_endpoint = "https://hub.example"`) or change part of one (`mirrors["repos"]["moonshotai/Kimi-K2.6"] =
"mirror/Kimi-K2.6"`); every public name it leaves is the group's value. Each shipped group file ends by
calling `overrides`, so the site applies to whatever loads group data as pyinfra does: the deploy,
bench.py, rollout.py, pin.py and `pytest tests/deployed`. Without SPECFLEET_SITE nothing changes.
"""

import ast
import copy
import difflib
import functools
import json
import runpy
import traceback
import types
from pathlib import Path
from typing import Any

from deployment import schema
from deployment.site_directory import CHECKOUT, SITE_ENV, directory  # noqa: F401 (this module's API too)

PINS_FILE = "pins.json"
TUNED_DIR = "tuned"
GROUP_DATA = CHECKOUT / "group_data"
# What makes a group file a host class: it says what the class's GPUs must be.
CLASS_KEY = "expected_gpus"
# The keys a class of the site sets: the knobs whose value is per class (schema). Any other key would sit
# behind group_data/all.py's, which pyinfra reads for every host before the site's class is asked.
CLASS_KNOBS = frozenset(knob.name for knob in schema.KNOBS if knob.group == schema._CLASS)


def host_classes() -> tuple[str, ...]:
    """The host classes, each an inventory group: every group_data/<class>.py of the product that declares
    `expected_gpus` (sorted), then every one of the site's (SITE/group_data/) that does and has no shipped
    group's name. A class is its one file: nothing else names it.

    >>> host_classes()[:3]
    ('b200_nvlink', 'b300_nvlink', 'h100_sxm')
    """
    product = _declaring(GROUP_DATA)
    site = directory()
    if site is None:
        return product
    shipped = {path.stem for path in GROUP_DATA.glob("*.py")}
    return product + tuple(name for name in _declaring(site / "group_data") if name not in shipped)


def _declaring(folder: Path) -> tuple[str, ...]:
    """The names of the group files in `folder` that assign CLASS_KEY at their top level, sorted."""
    files = sorted(folder.glob("*.py"))
    return _declaring_files(tuple((path, path.stat().st_mtime_ns) for path in files))


@functools.cache
def _declaring_files(files: tuple[tuple[Path, int], ...]) -> tuple[str, ...]:
    # Read, not run: a class file's code runs where pyinfra loads it, once (the deploy prepares every host).
    return tuple(path.stem for path, _ in files if CLASS_KEY in _assigned(path))


def _assigned(path: Path) -> set[str]:
    try:
        tree = ast.parse(path.read_text(), str(path))
    except SyntaxError:
        return set()  # said in one line where it runs (overrides, class_values)
    return {target.id for node in tree.body if isinstance(node, (ast.Assign, ast.AnnAssign))
            for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
            if isinstance(target, ast.Name)}


def class_data(data: Any, host_class: str) -> Any:
    """A host's data (pyinfra's, or any object with its attributes) for a host of `host_class`. pyinfra reads the
    product's group_data/ alone, so a class of the site's own reaches the host's data here: its file's values
    stand behind every layer pyinfra merged, where group data stands (host data and --data over it)."""
    if host_class not in host_classes() or (GROUP_DATA / f"{host_class}.py").is_file():
        return data
    return _Behind(data, class_values(host_class))


class _Behind:
    """`data` with a site class's values behind it: a key no layer of `data` sets is the class's."""

    def __init__(self, data: Any, values: dict):
        self._data, self._values = data, values

    def __getattr__(self, key: str):
        try:
            return getattr(self._data, key)
        except AttributeError:
            if key in self._values:
                return copy.copy(self._values[key])  # as pyinfra hands out group data: a shallow copy
            raise


def class_file_values(host_class: str) -> dict:
    """The values of a class's file: the product's group_data/<class>.py (the site's over it), else the site's
    own class (class_values)."""
    path = GROUP_DATA / f"{host_class}.py"
    return _public(runpy.run_path(str(path))) if path.is_file() else class_values(host_class)


def class_values(host_class: str) -> dict:
    """The values of SITE/group_data/<host_class>.py, a class of the site's own, with its tuned files
    (SITE/tuned/<host_class>/) as a shipped class file has them; stops in one line on a file that is no class."""
    path = directory() / "group_data" / f"{host_class}.py"
    return _class_values(path, path.stat().st_mtime_ns)


@functools.cache
def _class_values(path: Path, _mtime_ns: int) -> dict:
    found = _run(path, {})
    schema.check(found, schema.SITE, str(path))
    other = sorted(set(found) - CLASS_KNOBS)
    missing = sorted({CLASS_KEY, "sglang_tuning"} - set(found))
    if other or missing:
        wrong = f"sets {', '.join(other)}, which a class of the site may not set (group_data/all.py's value " \
                "would win): set it in SITE/group_data/all.py or the inventory" if other else \
                f"lacks {', '.join(missing)}: compare it with group_data/h100_sxm.py"
        raise SystemExit(f"{path} {wrong}")
    return {**found, "tuned": tuned(str(path))}


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
    found = _run(path, shipped)
    schema.check({key: value for key, value in found.items() if key not in shipped or value != shipped[key]},
                 schema.SITE, str(path))
    return found


def _run(path: Path, shipped: dict) -> dict:
    """The public values of the site's group file `path`, run over `shipped` (a shipped file's values, or none)."""
    try:
        return _public(runpy.run_path(str(path), init_globals=copy.deepcopy(shipped)))
    except Exception as error:  # the site's own code: said in one line, as a knob's value is
        line = next((f" (line {frame.lineno})" for frame in reversed(traceback.extract_tb(error.__traceback__))
                     if frame.filename == str(path)), "")
        if isinstance(error, SyntaxError):
            line = f" (line {error.lineno})"
        over = f"over group_data/{path.name}" if shipped else "as a class of the site"
        raise SystemExit(f"{path}{line}: {type(error).__name__}: {error}: fix it (it runs as Python {over}), "
                         f"or move it out of {path.parent}") from None


def _no_stray_files(site: Path, shipped: Path) -> None:
    """A site group file overriding no shipped one, and no class of its own, would be read by nothing: stop,
    naming the group meant."""
    groups = sorted(path.stem for path in shipped.glob("*.py"))
    own = set(_declaring(site / "group_data"))
    for path in sorted((site / "group_data").glob("*.py")):
        if path.stem not in groups and path.stem not in own:
            near = difflib.get_close_matches(path.stem, groups, n=1)
            raise SystemExit(f"{path} overrides no group of specfleet{f' (did you mean {near[0]}.py?)' if near else ''}: "
                             f"a site group file is named after one of group_data/ ({', '.join(groups)}), or is a "
                             f"class of the site's own (it declares {CLASS_KEY})")


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
    settings are checked where the deploy reads them (deployment/tuned.py)."""
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
    """Write a tuned file (deployment/tuned.py document()) through a temporary file renamed into place."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.tmp")
    temporary.write_text(json.dumps(document, indent=2) + "\n")
    temporary.replace(path)
    return path
