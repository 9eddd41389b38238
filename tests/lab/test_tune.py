"""tune.py end to end on one lab host: Qwen3.6-27B's algorithms compared (every profile of the model serving
one, on one GPU, the walk's trials of a few requests at two levels, as each level is a client run, the module's
largest cost, against the stand-in engine, whose speed model makes the numbers: modelled, not measured), the
winner and each algorithm's best with its speedup over AR per concurrency, the deployed configuration serving
again after, the pick (its profile included) in the site directory, served by the next deploy, a second deploy
changing nothing, and a pick of another build reported stale, not applied."""

import json
import os
import re
import subprocess

import pytest

from lab import fleet
from tests.helpers import (
    LAB_INVENTORY,
    PYINFRA,
    REPO,
    changed_operations,
    run_deploy,
    server_info,
    serving,
    write_group_data,
)

pytestmark = pytest.mark.lab


@pytest.fixture
def tune_site(site_dir, monkeypatch):
    """The test's own site directory, and afterwards the lab deployed without it."""
    yield site_dir
    monkeypatch.delenv("SPECFLEET_SITE")
    # The lab as it was for the tests after this one: its class's defaults deployed again.
    put_back = run_deploy("--limit", "lab-pcie-1")
    assert put_back.returncode == 0, put_back.output[-3000:]


def run_tune(host, *data: str, group_data=None) -> subprocess.CompletedProcess:
    extra = ["--group-data", str(group_data)] if group_data else []
    command = [str(PYINFRA), "-y", *extra, LAB_INVENTORY, "tune.py", "--limit", host.name,
               *(arg for item in data for arg in ("--data", item))]
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=1500, check=False,
                            env={**os.environ, "HF_TOKEN": "hf_lab_granted"})
    result.output = result.stdout + result.stderr
    return result


def test_tune_refuses_a_misspelt_knob_in_one_line(deployed_lab, pcie_host, tune_site):
    refused = run_tune(pcie_host, "objectve=latency")
    assert refused.returncode != 0 and "did you mean `objective`?" in refused.output, refused.output[-2000:]
    assert "Traceback" not in refused.output and "Starting operation" not in refused.output


# The algorithms compared: every one a profile of Qwen3.6-27B serves on the PCIe class.
ALGORITHMS = "ar,dflash,ddtree,mtp"
# Qwen3.6-27B on the PCIe host, one replica on one GPU: the tuner's candidates are its profiles' settings at
# that layout alone (a trial starts one unit), which keeps the module's trials few.
QWEN = "layouts = dict(base['layouts'], qwen36_ddtree=dict(tp_size=1, context_length=163840, replicas=1))"


def test_tune_compares_the_models_algorithms_keeps_the_best_and_the_next_deploy_serves_it(deployed_lab, pcie_host,
                                                                                         tune_site, tmp_path):
    qwen = serving("qwen36_ddtree", tmp_path / "qwen")
    write_group_data(qwen, "rtx_pro_6000_pcie", QWEN)
    deployed = run_deploy("--limit", pcie_host.name, group_data=qwen)
    assert deployed.returncode == 0, deployed.output[-3000:]
    results = tmp_path / "results"
    tune = run_tune(pcie_host, f"algorithms={ALGORITHMS}", "concurrency=1,4", "requests=4", "output_tokens=16",
                    f"results_dir={results}", group_data=qwen)
    assert tune.returncode == 0, tune.output[-4000:]
    assert "(LAB STAND-IN: timings come from the stand-in's speed model" in tune.output  # modelled, not measured
    # Per concurrency: the winner, then each algorithm's best with its speedup over AR measured in this run.
    for level in (1, 4):
        said = re.search(rf"concurrency {level}: (\w+) wins \((.+), #\d+\)", tune.output)
        assert said, tune.output[-4000:]
        rows = dict(re.findall(r"^\| (\w+) \| #\d+ .+ \| [\d,.]+ \| ([\d.]+)x \| [\d.-]+ \|$",
                               tune.output.split(f"concurrency {level}: ")[1].split("concurrency ")[0], re.M))
        assert set(rows) == {name.upper() for name in ALGORITHMS.split(",")} and rows["AR"] == "1.00"
        assert said.group(1) == max(rows, key=lambda name: float(rows[name])) and float(rows[said.group(1)]) > 1
    assert "speedup over AR" in tune.output and "(PICK)" in tune.output

    tuned = tune_site / "tuned" / "rtx_pro_6000_pcie" / "qwen36_ddtree.json"
    found = json.loads(tuned.read_text())
    pick = found["settings"]
    assert pick["profile"].startswith("qwen36_") and pick["tp_size"] == 1 and pick["replicas"] == 1
    assert found["measured_with"]["prompts"].startswith("sha256:")
    (run,) = results.iterdir()
    out = run / pcie_host.name / "qwen36_ddtree"
    kept = json.loads((out / "trials.json").read_text())
    assert set(kept["algorithms"]) == {"1", "4"} and kept["trials"][kept["pick"] - 1]["settings"] == pick
    assert "## The algorithms at each concurrency" in (out / "trials.md").read_text()
    # The deployed configuration serves again: DDTree's spine, budget 15, on one GPU.
    info = server_info(pcie_host)
    assert (info["speculative_algorithm"], info["speculative_ddtree_budget"], info["tp_size"]) == ("DDTREE", 15, 1)
    assert fleet.ssh(pcie_host, "systemctl list-units --no-legend 'specfleet-bench*' | wc -l").strip() == "0"

    # The next deploy serves the pick, its profile included, and says where each setting came from; a second
    # changes nothing.
    deploy = run_deploy("--limit", pcie_host.name, group_data=qwen)
    assert deploy.returncode == 0, deploy.output[-3000:]
    assert f"settings from {tuned}: profile (tuned), algorithm (tuned), num_draft_tokens (tuned)" in deploy.output
    info = server_info(pcie_host)
    assert (info["speculative_num_draft_tokens"] or 1, info["tp_size"]) == (pick["num_draft_tokens"], 1)
    again = run_deploy("--limit", pcie_host.name, group_data=qwen)
    assert again.returncode == 0 and changed_operations(again.output) == [], again.output[-3000:]

    # Measured with another build: stale, said in one line, not applied.
    found["measured_with"]["sglang"] = "f" * 40
    tuned.write_text(json.dumps(found))
    dry = run_deploy("--limit", pcie_host.name, "--dry", group_data=qwen)
    stale = [line for line in dry.output.splitlines() if "is stale, not applied" in line]
    assert len(stale) == 1 and f"sglang {'f' * 40} (deployed: " in stale[0], dry.output[-3000:]
