"""A profile whose algorithm drafts without a separate drafter (AR: a profile without `speculative`): resolved as
the deploy resolves it, it fetches, loads, renders, restarts on, tunes and benches no drafter; a profile
whose algorithm needs one and names none (or names one it would not load) is refused in one line. Facts in
(host data, a site directory), the deployment's weights, flags, unit inputs and tuner candidates out."""

import json

import pytest

from deployment import site_data
from deployment.hosts import at_commits, resolve
from deployment.knobs import BadHostData
from deployment.server.command_line import server_args
from operations.server.unit import inputs
from tests.unit.group_data import host_data
from tuning.candidates import candidates

HOST_CLASS = "rtx_pro_6000_pcie"
TARGET = "e" * 40
SGLANG_PIN = "sglang==0.5.23"


def with_profile(name: str, profile: dict, **data):
    """The class's host data serving `profile` (added to the shipped ones as `name`)."""
    shipped = host_data(HOST_CLASS).profiles
    return host_data(HOST_CLASS, profile=name, profiles={**shipped, name: profile}, **data)


def autoregressive(**extra) -> dict:
    """Qwen3.6-27B served autoregressively: the qwen36_ddtree profile without its drafter and speculation."""
    return {**dict(target=dict(repo="Qwen/Qwen3.6-27B", revision=TARGET), attention="mha",
                   served_model_name="qwen3.6-27b", server_args=["--trust-remote-code"],
                   sglang=dict(requirement=SGLANG_PIN, version="0.5.23")), **extra}


def test_a_profile_without_a_drafter_fetches_loads_and_renders_none():
    d = resolve(with_profile("qwen36_ar", autoregressive()), HOST_CLASS)
    assert [r.role for r in d.weights.repos] == ["target"] and d.weights.drafter is None
    assert d.engine.speculative.algorithm == "AR" and d.engine.draft_model_dir is None
    args = server_args(d.replicas[0])
    assert not [arg for arg in args if arg.startswith("--speculative")]
    assert args[args.index("--model-path") + 1] == f"/srv/specfleet/models/Qwen--Qwen3.6-27B/{TARGET}"
    pinned = at_commits(d, {"target": TARGET})
    assert pinned.engine.draft_model_dir is None
    # Its servers restart on the target's commit and the build, and on no drafter's.
    said = inputs(pinned.engine, pinned.weights.commits)
    assert f" target={TARGET[:12]} launcher=" in said and "drafter" not in said


@pytest.mark.parametrize("profile, said", [
    (autoregressive(speculative=dict(algorithm="DFLASH", num_draft_tokens=16)),
     "profiles['p']['drafter']=None is missing: DFLASH drafts with a separate drafter"),
    (autoregressive(drafter=dict(repo="z-lab/Qwen3.6-27B-DFlash", revision=TARGET)),
     "profiles['p']['drafter']={'repo': 'z-lab/Qwen3.6-27B-DFlash', 'revision': '" + TARGET + "'} is not used: "
     "AR loads no separate drafter: remove it"),
])
def test_a_drafter_the_algorithm_needs_and_lacks_or_would_not_load_is_refused_in_one_line(profile, said):
    with pytest.raises(BadHostData) as refusal:
        resolve(with_profile("p", profile), HOST_CLASS)
    assert str(refusal.value).startswith(said) and "\n" not in str(refusal.value)


def test_a_tuned_file_names_a_drafter_exactly_where_its_profile_has_one(site_dir):
    path = site_dir / "tuned" / HOST_CLASS / "p.json"
    path.parent.mkdir(parents=True)
    pick = {"algorithm": "DFLASH", "num_draft_tokens": 16, "tp_size": 2}
    prompts = "sha256:" + "0" * 64

    def deployed(measured_with: dict, drafter_commit: str):
        path.write_text(json.dumps({"settings": pick, "measured_with": measured_with}))
        profile = autoregressive(speculative=dict(algorithm="DFLASH", num_draft_tokens=16),
                                 drafter=dict(repo="z-lab/Qwen3.6-27B-DFlash", revision=drafter_commit))
        return resolve(with_profile("p", profile, tuned=site_data.tuned(f"group_data/{HOST_CLASS}.py")), HOST_CLASS)

    applied = deployed({"sglang": SGLANG_PIN, "drafter": "d" * 40, "prompts": prompts}, "d" * 40)
    assert applied.tuned.applied and applied.engine.tp_size == 2
    moved = deployed({"sglang": SGLANG_PIN, "drafter": "d" * 40, "prompts": prompts}, "a" * 40)
    assert f"drafter {'d' * 40} (deployed: {'a' * 40})" in moved.tuned.stale and moved.engine.tp_size != 2
    # Measured without a drafter (a profile that had none), it describes no deployment that loads one.
    without = deployed({"sglang": SGLANG_PIN, "prompts": prompts}, "d" * 40)
    assert f"drafter (none) (deployed: {'d' * 40})" in without.tuned.stale and without.engine.tp_size != 2


def test_the_tuner_compares_no_drafter_a_profile_that_drafts_nothing_does_not_hold():
    found, left_out = candidates(with_profile("qwen36_ar", autoregressive()), HOST_CLASS, "qwen36_ar",
                                 algorithms=("ar", "dflash", "ddtree"))
    assert [c.baseline for c in found] == [True] and found[0].settings["profile"] == "qwen36_ar"
    # The model's profiles that draft with a drafter need one this host does not hold: said, not tried.
    assert [line.split(":")[0] for line in left_out if not line.startswith("tp_size ")] == [
        "DFLASH (qwen36_ddtree)", "DDTREE (qwen36_ddtree)", "qwen36_ar"]
    assert left_out[-1] == ("qwen36_ar: no profile of Qwen/Qwen3.6-27B drafts with what this host holds (no "
                            "speculative settings to tune)")
