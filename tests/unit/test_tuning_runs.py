"""What tune.py is asked and what it shows (tuning/plan.py, tuning/report.py), and the bench units a trial serves
(serving_benchmark/units.py): knobs in, plan or one-line refusal out; figures in, table, kept figures and power
out; a candidate layout in, the host's command out."""

import json
import re

import pytest

from deployment import schema
from deployment.hosts import resolve
from deployment.knobs import BadHostData
from serving_benchmark import units
from tests.unit.group_data import RTX_MINORS, host_data
from tuning import report
from tuning.candidates import candidates
from tuning.plan import plan
from tuning.search import Figures, Result, Trial, objective

PCIE = "rtx_pro_6000_pcie"


@pytest.fixture
def site_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECFLEET_SITE", str(tmp_path))
    return tmp_path


def test_the_plan_reads_the_objective_at_its_level_with_the_benchs_workload(site_dir):
    found = plan({})
    assert (found.objective.name, found.objective.concurrency, found.search) == ("throughput", 8, "walk")
    assert found.bench.concurrency == (1, 8) and found.site == site_dir
    assert re.fullmatch(r"sha256:[0-9a-f]{64}", found.prompts_digest)
    latency = plan({"objective": "latency", "concurrency": "1,32", "max_tpot_ms": "20", "search": "grid"})
    assert (latency.objective.concurrency, latency.objective.max_tpot_ms, latency.search) == (1, 20.0, "grid")


@pytest.mark.parametrize(("data", "said"), [
    ({"search": "random"}, "search='random' is not accepted: use one of walk, grid"),
    ({"objective": "latency", "concurrency": "8,32"}, "objective=latency reads one request's speed at concurrency 1"),
    ({"objective": "speed"}, "objective='speed' is not accepted"),
    ({"max_ttft_ms": "soon"}, "max_ttft_ms='soon' is not a number"),
    ({"modes": "ar"}, "modes='ar' is not accepted by tune.py"),
    ({"algorithms": "ar,dflsh"}, "algorithms='ar,dflsh' is not accepted: use a comma-separated list of ar, dflash, "),
])
def test_a_bad_knob_is_refused_in_one_line(site_dir, data, said):
    with pytest.raises(BadHostData) as refused:
        plan(data)
    assert str(refused.value).startswith(said) and "\n" not in str(refused.value)


def test_the_algorithms_compared_are_a_knob_declared_once_whose_misspelling_meets_its_nearest_name(site_dir):
    assert schema.BY_NAME["algorithms"].subject == "tune" and schema.refused({"algorithms": "ar"}, schema.DATA, "") == []
    assert plan({}).algorithms is None and plan({"algorithms": "ddtree, ar,ddtree"}).algorithms == ("ddtree", "ar")
    with pytest.raises(BadHostData) as refused:
        plan({"algorithms": "ar,dflsh"})
    assert str(refused.value).endswith("('dflsh': did you mean dflash?)") and "\n" not in str(refused.value)


def test_without_a_site_directory_there_is_nowhere_to_keep_the_pick(monkeypatch):
    monkeypatch.delenv("SPECFLEET_SITE", raising=False)
    with pytest.raises(BadHostData, match="^tune.py writes its pick to SITE/tuned/CLASS/PROFILE.json: export"):
        plan({})


def test_a_misspelt_tuner_knob_meets_its_nearest_name():
    (line,) = schema.refused({"objectve": "latency"}, schema.DATA, "--data")
    assert line == ("--data sets `objectve`, which is no knob of specfleet: did you mean `objective`? "
                    "(docs/configuration.md lists every knob)")
    assert schema.refused({"objective": "latency", "search": "grid", "max_tpot_ms": "20"}, schema.DATA, "--data") == []


def test_the_power_draw_is_the_mean_of_each_samples_sum_over_the_gpus():
    assert report.power("300.5\n299.5\n310\n290\n", 2) == 600.0  # two samples of two GPUs
    assert report.power("300\n290\n305\n", 2) == 590.0  # a sample cut short at the stop is left out
    assert report.power("[N/A]\n[N/A]\n", 2) is None and report.power("", 1) is None


def test_a_trials_figures_are_the_benchs_level_result():
    level = {"output_tok_s": 812.5, "ttft_ms": {"avg": 95.0, "p50": 90}, "tpot_ms": {"avg": 12.5}, "accept_length": 6.1}
    f = report.figures(8, level, 1200.0)
    assert (f.throughput, f.ttft_ms, f.tpot_ms, f.accept_length, f.request_speed) == (812.5, 95.0, 12.5, 6.1, 80.0)
    assert f.tokens_per_joule == pytest.approx(812.5 / 1200)


def result_of_three():
    found, _ = candidates(host_data(PCIE, profile="qwen36_ddtree"), PCIE, "qwen36_ddtree",
                          algorithms=("dflash", "ddtree"))
    baseline, spine, tree = found[0], found[8], found[9]  # AR, DDTree budget 15, budget 31 at TP 1 x 8
    trials = [(baseline, Trial({8: Figures(8, 300.0, 90.0, 26.0, None, 2400.0)})),
              (spine, Trial({8: Figures(8, 1800.0, 100.0, 4.3, 8.1, 2600.0)})),
              (tree, Trial({8: Figures(8, 400.0, 120.0, 19.0, 5.0, 2600.0)}, stopped=True))]
    return Result(objective("throughput", (1, 8)), trials, trials[1], grid=45)


def test_the_table_shows_every_trial_its_speedup_and_the_pick():
    result = result_of_three()
    labels = [p.label for p, _ in result.trials]
    lines = report.table(result, labels).splitlines()
    assert lines[0] == "objective: throughput at concurrency 8; 3 trials of a grid of 45"
    assert lines[3] == "| 1 | AR TP1x8 | 300.0 | 90.0 | 26.00 | - | 0.125 | 1.00x |"
    assert lines[4] == "| 2 | DDTREE n=16 ddtree_budget=15 TP1x8 (PICK) | 1,800.0 | 100.0 | 4.30 | 8.10 | 0.692 | 6.00x |"
    assert lines[5].startswith("| 3 | DDTREE n=16 ddtree_budget=31 TP1x8 (stopped early) |")


def test_what_the_tuned_file_keeps_names_the_pick_and_every_trials_settings(tmp_path):
    result = result_of_three()
    labels, settings = [p.label for p, _ in result.trials], [p.settings for p, _ in result.trials]
    written = report.write(result, labels, settings, "walk", tmp_path, "lab-pcie-1 · qwen36_ddtree", stand_in=True,
                           left_out=["tp_size 3: does not divide 8 GPUs"])
    kept = json.loads((tmp_path / "trials.json").read_text())
    # The pick by its number in trials.md's table, which marks it (PICK) on the same row.
    assert kept["pick"] == 2 and kept["trials"][kept["pick"] - 1]["label"] == labels[1]
    md = (tmp_path / "trials.md").read_text().splitlines()
    assert md[0] == "# Tuning trials: lab-pcie-1 · qwen36_ddtree" and md[2] == f"**{report.STAND_IN_LABEL}.**"
    assert next(line for line in md if "(PICK)" in line).startswith(f"| {kept['pick']} | ")
    assert md[-3:] == ["## Left out before any trial (1)", "", "- tp_size 3: does not divide 8 GPUs"]
    assert kept["trials"][1]["settings"] == {
        "profile": "qwen36_ddtree", "algorithm": "DDTREE", "num_draft_tokens": 16, "ddtree_budget": 15, "tp_size": 1,
        "replicas": 8}
    # The algorithms at the objective's level, best first: DDTree's spine at 6x AR, the stopped tree trial out.
    assert kept["algorithms"] == {"8": [
        {"algorithm": "DDTREE", "trial": 2, "throughput": 1800.0, "speedup": 6.0, "accept_length": 8.1},
        {"algorithm": "AR", "trial": 1, "throughput": 300.0, "speedup": 1.0, "accept_length": None}]}
    assert "concurrency 8: DDTREE wins (DDTREE n=16 ddtree_budget=15 TP1x8, #2)" in md
    assert kept["trials"][2]["stopped"] and kept["trials"][1]["speedup"] == 6.0
    assert [p.name for p in written] == ["trials.json", "trials.md", "tune.png"]  # matplotlib: requirements-dev.txt
    png = (tmp_path / "tune.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and int.from_bytes(png[16:20], "big") > 100


def test_a_trials_layout_stops_every_deployed_replica_and_each_of_its_units_starts_them_all_again(monkeypatch):
    deployed = resolve(host_data(PCIE, profile="qwen36_ddtree"), PCIE).replicas
    found, _ = candidates(host_data(PCIE, profile="qwen36_ddtree"), PCIE, "qwen36_ddtree")
    tp2 = next(c for c in found if c.shape == (2, 4)).deployment.replicas
    sent = []
    monkeypatch.setattr(units.sandbox, "gpu_minor_numbers", lambda: RTX_MINORS)
    monkeypatch.setattr(units.remote, "run", lambda host, command: (sent.append(command), (True, ""))[1])
    units.start(None, deployed, tp2, [["--tp-size", "2"]] * 4, 600, previous=("specfleet-bench-qwen36_ddtree-gpu0",))
    (command,) = sent
    stop = next(part for part in command.split("; ") if part.startswith("systemctl stop "))
    assert all(r.service_name in stop for r in deployed) and "specfleet-bench-qwen36_ddtree-gpu0 " in stop
    starts = command.split("; ")[-1].split(" && ")
    assert len(starts) == 4 and "--unit=specfleet-bench-qwen36_ddtree-gpu0-1" in starts[0]
    every = " ".join(r.service_name for r in deployed)
    assert all(f"systemctl start --no-block {every}'" in start for start in starts)
