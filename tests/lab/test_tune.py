"""tune.py end to end on one lab host: every candidate of the deployed Kimi profile tried (search=grid, a few
requests at one level, as each level is a client run, the module's largest cost, against the stand-in engine,
whose speed model makes the numbers: modelled, not measured), the deployed configuration serving again after,
the pick in the site directory, served by the next deploy, a second deploy changing nothing, and a pick of
another build reported stale, not applied."""

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


def run_tune(host, *data: str) -> subprocess.CompletedProcess:
    command = [str(PYINFRA), "-y", LAB_INVENTORY, "tune.py", "--limit", host.name,
               *(arg for item in data for arg in ("--data", item))]
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=1500, check=False,
                            env={**os.environ, "HF_TOKEN": "hf_lab_granted"})
    result.output = result.stdout + result.stderr
    return result


def test_tune_refuses_a_misspelt_knob_in_one_line(deployed_lab, pcie_host, tune_site):
    refused = run_tune(pcie_host, "objectve=latency")
    assert refused.returncode != 0 and "did you mean `objective`?" in refused.output, refused.output[-2000:]
    assert "Traceback" not in refused.output and "Starting operation" not in refused.output


def test_tune_tries_every_candidate_keeps_the_best_and_the_next_deploy_serves_it(deployed_lab, pcie_host, tune_site,
                                                                                   tmp_path):
    results = tmp_path / "results"
    tune = run_tune(pcie_host, "search=grid", "concurrency=4", "requests=4", "output_tokens=16",
                    f"results_dir={results}")
    assert tune.returncode == 0, tune.output[-4000:]
    # The candidates left out, in one line before the first trial; each with its reason in trials.md.
    assert re.search(r"tune: \d+ candidates left out before any trial", tune.output), tune.output[-3000:]
    assert "left out DDTREE" not in tune.output
    for number in range(1, 10):  # AR, and DFlash at 4 and 8 draft tokens at each of the 4 layouts
        assert f"tune {number}: " in tune.output, tune.output[-3000:]
    assert "speedup over AR" in tune.output and "(PICK)" in tune.output

    tuned = tune_site / "tuned" / "rtx_pro_6000_pcie" / "kimi_k26_dflash.json"
    found = json.loads(tuned.read_text())
    pick = found["settings"]
    assert pick["algorithm"] == "DFLASH" and pick["num_draft_tokens"] in (4, 8) and pick["tp_size"] in (1, 2, 4, 8)
    assert found["measured_with"]["prompts"].startswith("sha256:") and len(found["measured_with"]["drafter"]) == 40
    assert found["figures"]["grid"] == 9 and len(found["figures"]["trials"]) == 9
    (run,) = results.iterdir()
    out = run / pcie_host.name / "kimi_k26_dflash"
    assert (out / "trials.json").is_file() and (out / "trials.md").is_file()
    assert "- DDTREE n=8 ddtree_budget=3 TP1x8: sglang==" in (out / "trials.md").read_text()  # a release: no DDTree
    assert "(LAB STAND-IN: timings come from the stand-in's speed model" in tune.output  # modelled, not measured

    # The deployed configuration serves again: DFlash at 8 draft tokens over all eight GPUs.
    info = server_info(pcie_host)
    assert (info["speculative_algorithm"], info["speculative_num_draft_tokens"], info["tp_size"]) == ("DFLASH", 8, 8)
    assert fleet.ssh(pcie_host, "systemctl list-units --no-legend 'specfleet-bench*' | wc -l").strip() == "0"

    # The next deploy serves the pick, says where each setting came from; a second changes nothing.
    deploy = run_deploy("--limit", pcie_host.name)
    assert deploy.returncode == 0, deploy.output[-3000:]
    assert f"settings from {tuned}: algorithm (tuned), num_draft_tokens (tuned)" in deploy.output
    info = server_info(pcie_host)  # the replica on GPU 0
    assert (info["speculative_num_draft_tokens"], info["tp_size"]) == (pick["num_draft_tokens"], pick["tp_size"])
    again = run_deploy("--limit", pcie_host.name)
    assert again.returncode == 0 and changed_operations(again.output) == [], again.output[-3000:]

    # Measured with another build: stale, said in one line, not applied.
    found["measured_with"]["sglang"] = "f" * 40
    tuned.write_text(json.dumps(found))
    dry = run_deploy("--limit", pcie_host.name, "--dry")
    stale = [line for line in dry.output.splitlines() if "is stale, not applied" in line]
    assert len(stale) == 1 and f"sglang {'f' * 40} (deployed: " in stale[0], dry.output[-3000:]
