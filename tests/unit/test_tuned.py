"""Tuned settings in the site directory (SITE/tuned/<class>/<profile>.json, deployment/tuned.py):
read through the class's group data as the deploy reads it (site_data.tuned), checked, applied over the class's
defaults where measured with the build and drafter deployed, and reported stale, not applied, where not.
Facts in (a site directory, host data), the deployment's rendered flags out."""

import json

import pytest

from deployment import site_data, tuned
from deployment.hosts import resolve
from deployment.knobs import BadHostData
from deployment.server.command_line import server_args
from operations.run import summary
from tests.unit.group_data import host_data

HOST_CLASS = "rtx_pro_6000_pcie"
SGLANG = "c" * 40
DRAFTER = "d" * 40
PINS = {"repos": {"z-lab/Qwen3.6-27B-DFlash@main": DRAFTER, "Qwen/Qwen3.6-27B@main": "e" * 40},
        "git": {"https://github.com/sgl-project/sglang@refs/pull/29907/head": SGLANG}}
MEASURED = {"sglang": SGLANG, "drafter": DRAFTER, "prompts": "sha256:" + "0" * 64}
PICK = {"algorithm": "DDTREE", "num_draft_tokens": 16, "ddtree_budget": 7, "tp_size": 2, "replicas": 4}


def write(site_dir, document: dict, profile: str = "qwen36_ddtree"):
    path = site_dir / "tuned" / HOST_CLASS / f"{profile}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document))
    return path


def deployed(**data):
    """The qwen36_ddtree deployment on the PCIe class as the deploy resolves it, its tuned files read as the
    class's group data reads them."""
    values = host_data(HOST_CLASS, profile="qwen36_ddtree", pins=PINS, tuned=site_data.tuned(f"group_data/{HOST_CLASS}.py"),
                       **data)
    return resolve(values, HOST_CLASS)


def flag(args: list[str], name: str) -> str:
    return args[args.index(name) + 1]


def test_without_a_tuned_file_the_class_and_profile_decide(site_dir):
    d = deployed()
    args = server_args(d.replicas[0])
    assert d.tuned is None and len(d.replicas) == 8 and flag(args, "--tp-size") == "1"
    assert flag(args, "--speculative-ddtree-budget") == "15"


def test_a_tuned_file_measured_with_the_deployed_build_sets_the_flags_and_says_where_each_came_from(site_dir):
    path = write(site_dir, {"settings": PICK, "measured_with": MEASURED, "figures": {"objective": "throughput"}})
    d = deployed()
    args = server_args(d.replicas[0])
    assert (flag(args, "--tp-size"), flag(args, "--speculative-ddtree-budget")) == ("2", "7")
    assert [r.gpus for r in d.replicas] == [(0, 1), (2, 3), (4, 5), (6, 7)]
    assert d.tuned.applied and d.tuned.sources == {
        "algorithm": "tuned", "num_draft_tokens": "tuned", "ddtree_budget": "tuned", "tp_size": "tuned",
        "replicas": "tuned"}
    line = tuned.said("qwen36_ddtree", d.tuned)
    assert line == f"qwen36_ddtree: settings from {path}: algorithm (tuned), num_draft_tokens (tuned), " \
                   "ddtree_budget (tuned), tp_size (tuned), replicas (tuned)"


def test_a_setting_the_file_leaves_out_stays_the_class_default_and_a_hosts_own_layout_is_kept_whole(site_dir):
    write(site_dir, {"settings": {"algorithm": "DDTREE", "num_draft_tokens": 16, "ddtree_budget": 11},
                     "measured_with": MEASURED})
    d = deployed()
    assert flag(server_args(d.replicas[0]), "--speculative-ddtree-budget") == "11" and len(d.replicas) == 8
    assert d.tuned.sources["tp_size"] == "class default" and d.tuned.sources["ddtree_budget"] == "tuned"
    write(site_dir, {"settings": PICK, "measured_with": MEASURED})
    (d,) = resolve(host_data(HOST_CLASS, pins=PINS, tuned=site_data.tuned(f"group_data/{HOST_CLASS}.py"),
                             deployments=[{"profile": "qwen36_ddtree", "tp_size": 4}]), HOST_CLASS),
    assert [r.gpus for r in d.replicas] == [(0, 1, 2, 3), (4, 5, 6, 7)]
    assert flag(server_args(d.replicas[0]), "--speculative-ddtree-budget") == "7"
    assert d.tuned.sources["tp_size"] == "host" and d.tuned.sources["replicas"] == "class default"


def test_a_tuned_file_of_another_build_or_drafter_is_stale_and_not_applied(site_dir):
    path = write(site_dir, {"settings": PICK, "measured_with": {**MEASURED, "sglang": "f" * 40}})
    d = deployed()
    assert not d.tuned.applied and len(d.replicas) == 8
    assert flag(server_args(d.replicas[0]), "--speculative-ddtree-budget") == "15"
    line = tuned.said("qwen36_ddtree", d.tuned)
    assert line == (f"qwen36_ddtree: {path} is stale, not applied: measured with sglang {'f' * 40} (deployed: "
                    f"{SGLANG}); run tune.py again on this build") and "\n" not in line
    write(site_dir, {"settings": PICK, "measured_with": MEASURED})
    unpinned = resolve(host_data(HOST_CLASS, profile="qwen36_ddtree", pins={"git": PINS["git"]},
                                 tuned=site_data.tuned(f"group_data/{HOST_CLASS}.py")), HOST_CLASS)
    assert not unpinned.tuned.applied and "drafter " + DRAFTER + " (deployed: (a moving revision" in unpinned.tuned.stale


@pytest.mark.parametrize(("settings", "said"), [
    ({**PICK, "ddtree_budgt": 7}, "settings['ddtree_budgt'] is no tuned setting (did you mean ddtree_budget?)"),
    ({**PICK, "draft_window_size": 4096}, "settings['draft_window_size'] is no setting of DDTREE"),
    ({**PICK, "algorithm": "NOPE"}, "settings['algorithm'] 'NOPE' is not one of AR, DFLASH, DDTREE"),
    ({**PICK, "profile": "qwen36 ddtree"}, "settings['profile']='qwen36 ddtree' is not accepted: use a profile name"),
    ({**PICK, "tp_size": "two"}, "settings['tp_size']='two' is not a whole number"),
])
def test_a_misspelt_or_unknown_setting_is_refused_in_one_line_naming_the_file_and_the_key(site_dir, settings, said):
    path = write(site_dir, {"settings": settings, "measured_with": MEASURED})
    with pytest.raises(BadHostData) as refused:
        deployed()
    message = str(refused.value)
    assert message.startswith(f"{path}: ") and said in message and "\n" not in message


def test_a_file_that_is_not_json_stops_in_one_line_naming_it(site_dir):
    path = site_dir / "tuned" / HOST_CLASS / "qwen36_ddtree.json"
    path.parent.mkdir(parents=True)
    path.write_text("{not json")
    with pytest.raises(SystemExit) as stopped:
        site_data.tuned(f"group_data/{HOST_CLASS}.py")
    assert str(stopped.value).startswith(f"{path} is not what tune.py writes") and "\n" not in str(stopped.value)


def test_what_the_tuner_writes_the_deploy_reads_back(site_dir):
    path = site_data.tuned_path(HOST_CLASS, "qwen36_ddtree")
    site_data.write_tuned(path, tuned.document(path, PICK, MEASURED, {"objective": "throughput"}))
    d = deployed()
    assert d.tuned.path == path and d.tuned.applied and len(d.replicas) == 4
    with pytest.raises(BadHostData):
        tuned.document(path, {**PICK, "budget": 3}, MEASURED, {})


def test_the_run_says_each_deployments_line_at_its_start(site_dir, caplog):
    write(site_dir, {"settings": PICK, "measured_with": {**MEASURED, "drafter": "a" * 40}})
    with caplog.at_level("INFO", logger="pyinfra"):
        summary.tuned_report("gpu-1", (deployed(),))
    (record,) = caplog.records
    assert record.levelname == "WARNING" and record.getMessage().startswith("gpu-1: qwen36_ddtree: ") \
        and "is stale, not applied" in record.getMessage()


# Qwen3.6-27B without speculation: another profile of the model qwen36_ddtree serves, on a release build.
PLAIN = {"target": {"repo": "Qwen/Qwen3.6-27B", "revision": "main"}, "attention": "mha",
         "served_model_name": "qwen3.6-27b", "server_args": ["--trust-remote-code"],
         "sglang": {"requirement": "sglang==0.5.23", "version": "0.5.23"}}
PLAIN_PICK = {"profile": "qwen36_plain", "algorithm": "AR", "num_draft_tokens": 1, "tp_size": 2, "replicas": 4}


def test_a_tuned_file_naming_another_profile_of_the_model_serves_it_under_the_deployments_name(site_dir):
    profiles = {**host_data(HOST_CLASS).profiles, "qwen36_plain": PLAIN}
    path = write(site_dir, {"settings": PLAIN_PICK,
                            "measured_with": {"sglang": "sglang==0.5.23", "prompts": MEASURED["prompts"]}})
    d = deployed(profiles=profiles)
    args = server_args(d.replicas[0])
    assert d.tuned.applied and (d.name, d.engine.profile_name) == ("qwen36_ddtree", "qwen36_plain")
    assert d.weights.drafter is None and not [arg for arg in args if arg.startswith("--speculative")]
    assert flag(args, "--tp-size") == "2" and len(d.replicas) == 4 and d.engine.sglang_requirement == "sglang==0.5.23"
    assert tuned.said(d.name, d.tuned).startswith(f"qwen36_ddtree: settings from {path}: profile (tuned), "
                                                  "algorithm (tuned)")
    # Measured with another build of that profile: stale, and the deployment serves its own profile.
    write(site_dir, {"settings": PLAIN_PICK, "measured_with": {"sglang": "f" * 40, "prompts": MEASURED["prompts"]}})
    d = deployed(profiles=profiles)
    assert not d.tuned.applied and d.engine.profile_name == "qwen36_ddtree" and d.weights.drafter is not None
    assert "measured with sglang " + "f" * 40 + " (deployed: sglang==0.5.23)" in d.tuned.stale


@pytest.mark.parametrize(("settings", "said"), [
    ({**PICK, "profile": "kimi_k26_dflash"}, "settings['profile'] 'kimi_k26_dflash' serves moonshotai/Kimi-K2.6, "
                                             "not qwen36_ddtree's Qwen/Qwen3.6-27B"),
    ({**PLAIN_PICK, "profile": "qwen36_ddtree"}, "settings['algorithm'] 'AR' drafts nothing, but profile "
                                                 "'qwen36_ddtree' names a drafter"),
])
def test_a_tuned_profile_of_another_model_or_one_its_algorithm_cannot_serve_is_refused_in_one_line(
        site_dir, settings, said):
    path = write(site_dir, {"settings": settings, "measured_with": MEASURED})
    with pytest.raises(BadHostData) as refused:
        deployed()
    message = str(refused.value)
    assert message.startswith(f"{path}: ") and said in message and "\n" not in message
