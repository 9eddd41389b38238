"""Tuned settings: what tune.py measured best for a profile on a class, kept in the site directory
(SITE/tuned/<class>/<profile>.json, never in this checkout) and deployed over the class's defaults.

    {"settings": {"profile": ..., "algorithm": ..., "num_draft_tokens": 16, "ddtree_budget": 15, "tp_size": 1,
                  "replicas": 8},
     "measured_with": {"sglang": COMMIT, "drafter": COMMIT, "prompts": "sha256:HEX"},
     "figures": {...}}                                 # the objective, the winner's figures and every trial's

A setting it holds wins over the profile's (group_data/all.py) and the class's layout (group_data/<class>.py
`layouts`); a host's own `deployments` entry naming a tp_size or replicas keeps its layout whole. Its
`profile`, where it names another profile of the same target model (the tuner compares the model's
profiles: another algorithm, drafter or build), is served in the deployment's place, under the deployment's
name. It is applied only to a deployment that runs the
SGLang build and the drafter commit it was measured with (a profile without a drafter: its build alone, and
its file names no drafter): another is reported stale, in one line, and served
with its defaults. A key no setting has, or a value none accepts, refuses the host in one line naming the
file and the key.
"""

import difflib
import re
from dataclasses import dataclass, field
from pathlib import Path

from deployment import knobs
from deployment.knobs import BadHostData
from deployment.server import speculative
from deployment.weights.config import Repo

LAYOUT_KEYS = ("tp_size", "replicas")  # the layout's part of the settings (deployment/server/layout.py KEYS)
MEASURED_WITH = ("sglang", "drafter", "prompts")  # a profile without a drafter: all but the drafter
DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
BUILD = re.compile(f"{knobs.COMMIT.pattern}|{knobs.REQUIREMENT.pattern}")  # a commit, else a release pin or a wheel


def setting_keys() -> tuple[str, ...]:
    """What a tuned file's settings may hold: the profile served, the speculative algorithm's, the target
    backend, the layout's."""
    return ("profile", "algorithm", "num_draft_tokens", *speculative.settings(), "attention_backend", *LAYOUT_KEYS)


@dataclass(frozen=True)
class Tuned:
    """A tuned file, read and checked."""

    path: Path
    settings: dict
    measured_with: dict[str, str]
    figures: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Use:
    """What a deployment takes of its tuned file: where it is, whether it applies (else `stale` says why), and
    where each of its settings comes from (`sources`: setting -> "tuned" or its default's owner)."""

    path: Path | None  # None: settings a tuner tries (tuning/candidates.py), in no file
    settings: dict
    stale: str | None
    sources: dict[str, str]

    @property
    def applied(self) -> bool:
        return self.stale is None


def _refused(where: Path, key: str, problem: str) -> BadHostData:
    return BadHostData(f"{where}: {key} {problem}: fix it, or run tune.py again to write it anew")


def settings(where: Path, values) -> dict:
    """A tuned file's settings, checked as the profile's and the layout's knobs are (BadHostData naming the
    file and the key otherwise)."""
    if not isinstance(values, dict) or "algorithm" not in values or "num_draft_tokens" not in values:
        raise _refused(where, "settings", "is not a dict with algorithm and num_draft_tokens")
    known = setting_keys()
    for key in values:
        if key not in known:
            near = difflib.get_close_matches(str(key), known, n=1)
            raise _refused(where, f"settings[{key!r}]", f"is no tuned setting{f' (did you mean {near[0]}?)' if near else ''}"
                           f" (the settings are {', '.join(known)})")
    names = tuple(speculative.ALGORITHMS)  # autoregressive decoding too: a profile of the model that drafts nothing
    if values["algorithm"] not in names:
        raise _refused(where, "settings['algorithm']", f"{values['algorithm']!r} is not one of {', '.join(names)}")
    entry = speculative.ALGORITHMS[values["algorithm"]]
    foreign = sorted(key for key in speculative.settings() if key in values and key not in entry.settings)
    if foreign:
        raise _refused(where, f"settings[{foreign[0]!r}]", f"is no setting of {entry.name}")
    checked = {}
    for key, value in values.items():
        if key == "algorithm":
            checked[key] = value
        elif key == "profile":
            checked[key] = knobs.matching(f"{where}: settings['profile']", value, knobs.PROFILE_NAME,
                                          "a profile name (a key of profiles)")
        elif key == "attention_backend":
            checked[key] = knobs.matching(f"{where}: settings['attention_backend']", value, knobs.BACKEND,
                                          "an SGLang backend name")
        else:
            checked[key] = knobs.integer(f"{where}: settings[{key!r}]", value, minimum=1)
    return checked


def read(data_tuned, profile: str) -> Tuned | None:
    """The tuned file of `profile` (group data `tuned`, site_data.tuned's), checked; None where the site holds none."""
    entry = (data_tuned or {}).get(profile)
    if entry is None:
        return None
    where, found = Path(entry["path"]), entry["found"]
    if not isinstance(found, dict) or set(found) - {"settings", "measured_with", "figures"}:
        raise _refused(where, "the file", "is not a dict of settings, measured_with and figures")
    measured = found.get("measured_with")
    if not isinstance(measured, dict) or set(measured) - {"drafter"} != set(MEASURED_WITH) - {"drafter"}:
        raise _refused(where, "measured_with", f"does not hold exactly {', '.join(MEASURED_WITH)}")
    knobs.matching(f"{where}: measured_with['prompts']", measured["prompts"], DIGEST, "sha256:HEX")
    if "drafter" in measured:
        knobs.matching(f"{where}: measured_with['drafter']", measured["drafter"], knobs.COMMIT, "a 40-hex commit")
    knobs.matching(f"{where}: measured_with['sglang']", measured["sglang"], BUILD, "a commit or a requirement")
    return Tuned(where, settings(where, found.get("settings")), dict(measured), dict(found.get("figures") or {}))


def deployed_with(sglang_build: str, drafter: Repo | None) -> dict[str, str]:
    """What a deployment's tuned file must have been measured with: its SGLang build, and its drafter's
    commit where its profile has a drafter (a revision the hub has not resolved matches none)."""
    if drafter is None:
        return {"sglang": sglang_build}
    return {"sglang": sglang_build, "drafter": drafter.commit or "(a moving revision, not a commit)"}


def stale(tuned: Tuned, wanted: dict[str, str]) -> str | None:
    """Why `tuned` does not describe what is deployed (`deployed_with`: another SGLang build or drafter
    commit, or a drafter where there was none), else None."""
    differ = [f"{key} {tuned.measured_with.get(key, '(none)')} (deployed: {wanted.get(key, '(none)')})"
              for key in ("sglang", "drafter") if tuned.measured_with.get(key) != wanted.get(key)]
    if not differ:
        return None
    return (f"{tuned.path} is stale, not applied: measured with {'; '.join(differ)}; run tune.py again on "
            "this build")


def over(profile: dict, layout_values: dict, values: dict, entry: dict) -> tuple[dict, dict]:
    """`profile` and its layout's values with tuned `values` over them: the tuned algorithm keeps the
    profile's own values of its settings that the tuned ones do not name (DFlash's draft window); the
    layout stays the host's where its `deployments` entry names one (`entry`)."""
    algorithm = speculative.ALGORITHMS[values["algorithm"]]
    own = {key: value for key, value in profile.get("speculative", {}).items() if key in algorithm.settings}
    spec = {**own, **{key: value for key, value in values.items()
                      if key in ("algorithm", "num_draft_tokens") or key in algorithm.settings}}
    tuned_profile = {**profile, "speculative": spec} if algorithm.drafts else \
        {key: value for key, value in profile.items() if key != "speculative"}
    if "attention_backend" in values:
        tuned_profile["attention_backend"] = values["attention_backend"]
    if any(key in entry for key in LAYOUT_KEYS):
        return tuned_profile, layout_values
    return tuned_profile, {**layout_values, **{key: values[key] for key in LAYOUT_KEYS if key in values}}


def sources(tuned_values: dict, entry: dict) -> dict[str, str]:
    """Where each setting of a deployment comes from: "tuned" (its file), "host" (its `deployments` entry),
    "class default" (group_data/<class>.py layouts) or "profile" (group_data/all.py)."""
    host_layout = any(key in entry for key in LAYOUT_KEYS)  # the layout is taken whole, the host's or tuned

    def source(key):
        if key in LAYOUT_KEYS and host_layout:
            return "host" if key in entry else "class default"
        if key in tuned_values:
            return "tuned"
        return "class default" if key in LAYOUT_KEYS else "profile"
    return {key: source(key) for key in setting_keys() if key in tuned_values or key in LAYOUT_KEYS
            or key in ("algorithm", "num_draft_tokens")}


def said(deployment: str, use: Use) -> str:
    """The one line a deploy prints of a deployment's tuned file: stale, or where each setting came from."""
    if use.stale:
        return f"{deployment}: {use.stale}"
    return f"{deployment}: settings from {use.path or 'the tuner'}: " + ", ".join(f"{key} ({where})" for key, where in use.sources.items())


def document(where: Path, values: dict, measured_with: dict, figures: dict) -> dict:
    """A tuned file's contents (site.write_tuned writes it to `where`), checked as the deploy reads it."""
    found = {"settings": values, "measured_with": measured_with, "figures": figures}
    read({"it": {"path": str(where), "found": found}}, "it")
    return found
