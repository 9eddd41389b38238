"""A misspelt knob, at any layer, is refused in one line naming it and the knob meant, before any host changes
(deployment/schema.py); --dry gates a change: a refused host makes it exit non-zero, with -y too."""

import os
import re
import subprocess
import sys

import pytest

import lab
from lab import fleet
from tests.helpers import (LAB_HOSTS, LAB_INVENTORY, PYINFRA, REPO, UNIT_FILE, main_pid, operations_started, run_deploy,
                           write_group_data)

pytestmark = pytest.mark.lab


def state_of(hosts) -> dict:
    return {h.name: (main_pid(h), fleet.ssh(h, f"sha1sum {UNIT_FILE}")) for h in hosts}


def test_a_misspelt_data_key_is_refused_in_one_line_and_nothing_changes(deployed_lab, lab_hosts):
    before = state_of(lab_hosts)
    result = run_deploy("--data", "proflie=qwen36_ddtree", timeout=120)
    assert result.returncode == 1 and "Traceback" not in result.output, result.output[-3000:]
    line = ("--data sets `proflie`, which is no knob of specfleet: did you mean `profile`? "
            "(docs/configuration.md lists every knob)")
    assert [said for said in result.output.splitlines() if "proflie" in said] == [line], result.output[-3000:]
    assert operations_started(result.output) == []
    assert state_of(lab_hosts) == before


def test_a_site_file_with_a_misspelt_key_is_refused_in_one_line_and_nothing_changes(
        deployed_lab, lab_hosts, tmp_path, monkeypatch):
    (tmp_path / "site" / "group_data").mkdir(parents=True)
    site_file = tmp_path / "site" / "group_data" / "all.py"
    site_file.write_text("hf_endpont = 'https://hub.example'\n")
    monkeypatch.setenv("SPECFLEET_SITE", str(tmp_path / "site"))
    before = state_of(lab_hosts)
    result = run_deploy(timeout=120)
    assert result.returncode == 1 and "Traceback" not in result.output, result.output[-3000:]
    line = (f"{site_file} sets `hf_endpont`, which is no knob of specfleet: did you mean `hf_endpoint`? "
            "(docs/configuration.md lists every knob)")
    assert [said for said in result.output.splitlines() if "hf_endpont" in said] == [line], result.output[-3000:]
    assert operations_started(result.output) == []
    assert state_of(lab_hosts) == before


@pytest.mark.parametrize("yes", [False, True], ids=["dry", "dry -y"])
def test_dry_with_a_refused_host_says_why_and_exits_non_zero(deployed_lab, pcie_host, b200_host, tmp_path, yes):
    """Under -y pyinfra evaluates no operation before the run: the refusal is said as deploy.py is read."""
    no_mla = write_group_data(tmp_path, "b200_nvlink", (
        "sglang_tuning = copy.deepcopy(base['sglang_tuning'])\n"
        "del sglang_tuning['attention_backends']['mla']"))
    command = [str(PYINFRA), *(["-y"] if yes else []), "--group-data", str(no_mla), LAB_INVENTORY, "deploy.py",
               "--dry"]
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300)
    output = result.stdout + result.stderr
    assert result.returncode == 1 and "Traceback" not in output, output[-3000:]
    refusal = (f"[{b200_host.name}] {b200_host.name}: profiles['kimi_k26_dflash']['attention']='mla' is not accepted: "
               "use one of mha (sglang_tuning attention_backends of b200_nvlink)")
    assert output.count(refusal) == 1, output[-3000:]
    assert f"[{pcie_host.name}]" in output and "Beginning operation run" not in output


@pytest.mark.parametrize("yes", [False, True], ids=["dry", "dry -y"])
def test_dry_with_a_token_denied_a_gated_repo_says_so_per_host_and_exits_non_zero(deployed_lab, lab_hosts, yes):
    """The hub's refusal is made inside preflight, which pyinfra's -y does not evaluate before the run: --dry -y
    evaluates it all the same (failing.dry_is_a_gate), so it gates a change as --dry does."""
    before = state_of(lab_hosts)
    command = [str(PYINFRA), *(["-y"] if yes else []), LAB_INVENTORY, "deploy.py", "--dry"]
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300,
                            env={**os.environ, "HF_TOKEN": "hf_lab_denied"})
    output = result.stdout + result.stderr
    assert result.returncode == 1 and "Traceback" not in output, output[-3000:]
    for h in lab_hosts:
        said = [line for line in output.splitlines()
                if f"{h.name}: the token has no access to the gated repo lab/Kimi-K2.6-DFlash-tiny" in line]
        assert len(said) == 1, output[-3000:]
    assert "Beginning operation run" not in output and state_of(lab_hosts) == before
    if not yes:  # a refused preflight changes nothing: pyinfra's table of detected changes says so
        detected = output.split("--> Detected changes:")[1].splitlines()
        assert re.split(r"\s{2,}", next(line for line in detected if "Preflight" in line).strip())[:2] == \
            ["Preflight", "-"], output[-3000:]


def test_a_kv_cache_below_min_kv_tokens_is_refused_in_dry_in_one_line(deployed_lab, pcie_host):
    """Preflight's KV plan (deployment/server/capacity.py) against the floor: refused before anything changes,
    naming the replica, its tokens and min_kv_tokens."""
    result = run_deploy("--limit", pcie_host.name, "--dry", "--data", "min_kv_tokens=100000000", timeout=300)
    assert result.returncode == 1 and "Traceback" not in result.output, result.output[-3000:]
    (line,) = [said for said in result.output.splitlines() if "min_kv_tokens" in said]
    assert re.search(rf"\[{pcie_host.name}\] {pcie_host.name}: sglang@kimi_k26_dflash-gpu0-7: its KV cache holds "
                     r"\d+ tokens \([\d.]+ GiB a GPU at \d+ bytes a token\), fewer than min_kv_tokens 100000000: "
                     r"run fewer replicas", line), line



@pytest.fixture(scope="module")
def with_gateway_host(lab_hosts):
    """The shared lab's hosts and a gateway host (lab-gateway-1, booted, not deployed: the refusals below are
    made from the inventory's data before any host changes); the gateway host is stopped afterwards."""
    yield lab.up(f"{LAB_HOSTS},gateway=1", log=lambda line: None)
    lab.up(LAB_HOSTS, log=lambda line: None)


@pytest.mark.parametrize("tool, args", [
    ("pyinfra", ["deploy.py", "--dry"]), ("pyinfra", ["-y", "deploy.py"]), ("pyinfra", ["bench.py", "--dry"]),
    ("pyinfra", ["tune.py", "--dry"]), ("pyinfra", ["status.py"]), ("rollout.py", ["-y"]), ("pin.py", [])],
    ids=["deploy --dry", "deploy -y", "bench --dry", "tune --dry", "status", "rollout", "pin"])
@pytest.mark.parametrize("typo", [False, True], ids=["--data profile=nosuch", "site typo"])
def test_an_unknown_profile_is_one_line_per_host_with_the_nearest_name_on_every_command(
        with_gateway_host, tmp_path, tool, args, typo):
    """An inventory with a gateway reads the profile on every host, the gateway's model included: an unknown
    name is one line a host that reads it (the nearest profile named), exit 1, no traceback, whatever the
    command. A bench, a tune and pin read the workers' alone; a rollout stops at its first batch's."""
    site = tmp_path / "site"
    (site / "group_data").mkdir(parents=True)
    if typo:
        (site / "group_data" / "all.py").write_text('profile = "qwen36_ddtre"\n')
        chosen, refusal = [], ("profile='qwen36_ddtre' is no profile: did you mean 'qwen36_ddtree'? (profiles: "
                               "kimi_k26_ddtree, kimi_k26_dflash, qwen36_ar, qwen36_ddtree, qwen36_mtp; group_data/all.py and a site's)")
    else:
        chosen, refusal = ["--data", "profile=nosuch"], ("profile='nosuch' is no profile: use one of kimi_k26_ddtree, "
                                                         "kimi_k26_dflash, qwen36_ar, qwen36_ddtree, qwen36_mtp "
                                                         "(profiles of group_data/all.py and a site's)")
    argv = [str(PYINFRA), *(["-y"] if "-y" in args else []), LAB_INVENTORY, *(a for a in args if a != "-y")] \
        if tool == "pyinfra" else [sys.executable, tool, LAB_INVENTORY, *args]
    run = subprocess.run([*argv, *chosen], cwd=REPO, capture_output=True, text=True, timeout=300,
                         stdin=subprocess.DEVNULL,
                         env={**os.environ, "HF_TOKEN": "hf_lab_granted", "SPECFLEET_SITE": str(site)})
    output = run.stdout + run.stderr
    assert run.returncode == 1 and "Traceback" not in output and "KeyError" not in output, output[-3000:]
    said = [line for line in output.splitlines() if refusal in line]
    workers = [h.name for h in with_gateway_host if h.host_class != "gateway"]
    if tool == "rollout.py":
        readers = [re.search(r"rollout: batch 1/\d+: (\S+)", output)[1]]
    elif tool == "pin.py" or args[0] in ("bench.py", "tune.py"):
        readers = workers
    else:
        readers = [h.name for h in with_gateway_host]
    for name in readers:  # the refusal line (the status table's row)
        assert [line for line in said if name in line], output[-3000:]
    assert not [line for line in said if not any(name in line for name in readers)], output[-3000:]


@pytest.mark.parametrize("deploy_file, data, refusal", [
    ("bench.py", "modes=ar,eagle", "modes='ar,eagle' is not accepted: use a comma-separated list of ar, dflash, ddtree"),
    ("tune.py", "objective=speed", "objective='speed' is not accepted: use one of throughput, latency"),
], ids=["bench", "tune"])
def test_a_bench_or_tune_refusal_is_said_once_per_host_and_exits_non_zero(lab_hosts, deploy_file, data, refusal):
    """No summary ends a bench or a tune: the refusal is said once as the file is read, not again as an
    operation's name and a results row counted as no change."""
    run = subprocess.run([str(PYINFRA), "-y", LAB_INVENTORY, deploy_file, "--data", data], cwd=REPO,
                         capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL,
                         env={**os.environ, "HF_TOKEN": "hf_lab_granted", "SPECFLEET_SITE": ""})
    output = run.stdout + run.stderr
    assert run.returncode == 1 and "Traceback" not in output, output[-3000:]
    for h in lab_hosts:
        assert output.count(f"{h.name}: {refusal}") == 1, output[-3000:]
    assert operations_started(output) == [], output[-3000:]
