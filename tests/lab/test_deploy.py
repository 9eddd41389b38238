"""The deploy against the lab, through pyinfra as a user runs it: converge, no-op, change, refuse."""

import json
import os
import re
import subprocess
import sys

import pytest

from deployment.server import capacity, resident
from lab import fleet
from lab.config import HUB_URL, TOKEN_GRANTED, WHEELS_URL
from lab.hub import read_request_log
from lab.services import HUB_STATE
from tests.helpers import (LAB_INVENTORY, REPO, SGLANG_UNIT, UNIT_FILE, changed_operations, main_pid,
                           operations_started, results_table, run_deploy, server_info, serving, write_group_data)
from tests.unit.group_data import host_data

pytestmark = pytest.mark.lab


def test_first_deploy_serves_and_prints_accept_length_from_every_host(deployed_lab, lab_hosts):
    for host in lab_hosts:
        line = next(l for l in deployed_lab.output.splitlines() if f"[{host.name}] serving DFLASH" in l)
        assert "accept length" in line and "completion: '" in line
        info = server_info(host)
        assert info["speculative_algorithm"] == "DFLASH" and info["internal_states"][0]["avg_spec_accept_length"] > 1


def test_each_engine_holds_its_plan_and_at_most_the_plans_reserve_besides(deployed_lab, lab_hosts):
    """The stand-in sizes its pool as SGLang 0.5.23 does, from the GPU stand-in's real card memory, and holds
    nothing before its load (no CUDA context, no NCCL): its engine holds the plan's tokens plus at most what the
    plan sets aside for those (capacity.py: mem_fraction_static of what is resident before the load and of what
    CUDA does not show of the card). A planner that plans more tokens than the engine's arithmetic gives, or
    fewer beyond that, fails here (tests/deployed holds a real engine to the plan from below only)."""
    for host in lab_hosts:
        (plan_file,) = fleet.ssh(host, "ls /etc/specfleet/*.kv-plan.json").split()
        plan = json.loads(fleet.ssh(host, f"cat {plan_file}"))
        info = server_info(host)
        card_mib = int(fleet.ssh(host, "nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits").split()[0])
        set_aside = (resident.cuda_unseen_bytes(card_mib << 20) + resident.resident_before_load(info["tp_size"])) \
            * info["mem_fraction_static"]
        extra = info["max_total_num_tokens"] - plan["planned_tokens"]
        # + 1: the plan and the engine each floor their pool to whole tokens
        assert 0 <= extra <= set_aside // plan["bytes_per_token"] + 1, (host.name, extra, plan)


def test_second_run_changes_nothing_and_dry_run_shows_nothing(deployed_lab, lab_hosts):
    again = run_deploy()
    assert again.returncode == 0, again.output[-3000:]
    assert changed_operations(again.output) == [], "changed on a re-run"
    dry = run_deploy("--dry")
    assert dry.returncode == 0, dry.output[-3000:]
    detected = dry.output.split("--> Detected changes:")[1].split("Detected changes may")[0]
    for line in detected.splitlines()[2:]:
        if line.strip():
            assert re.split(r"\s{2,}", line.strip())[1:] == ["-", "-"], f"--dry would change: {line}"
    # --dry says what each replica's KV cache holds (preflight's plan, deployment/server/capacity.py)
    for host in lab_hosts:
        (said,) = [line for line in dry.output.splitlines() if f"[{host.name}] preflight passed: " in line]
        assert re.search(r"; KV cache [\d,]+ tokens, \d+ requests of 8,192 tokens a replica\)", said), said


def test_changing_draft_tokens_rewrites_the_unit_and_restarts_only_sglang(deployed_lab, lab_hosts, tmp_path):
    host = lab_hosts[0]
    before = {unit: main_pid(host, unit) for unit in
              (SGLANG_UNIT, "specfleet-weights-moonshotai--Kimi-K2.6", "nvidia-persistenced", "ssh")}
    override = write_group_data(tmp_path, "all", (
        "profiles = copy.deepcopy(base['profiles'])\n"
        "profiles['kimi_k26_dflash']['speculative']['num_draft_tokens'] = 6"))
    changed = run_deploy(group_data=override)
    try:
        assert changed.returncode == 0, changed.output[-3000:]
        changed_ops = {op for op, (_, success, _, _) in results_table(changed.output).items() if success != "-"}
        assert changed_ops == {f"SGLang service {SGLANG_UNIT}", f"SGLang generates {SGLANG_UNIT}"}, changed_ops
        after = {unit: main_pid(host, unit) for unit in before}
        assert after[SGLANG_UNIT] != before[SGLANG_UNIT]
        assert {u: after[u] for u in before if u != SGLANG_UNIT} == {u: before[u] for u in before if u != SGLANG_UNIT}
        assert "--speculative-num-draft-tokens 6" in fleet.ssh(host, f"cat {UNIT_FILE}")
        assert server_info(host)["speculative_num_draft_tokens"] == 6
    finally:
        assert run_deploy().returncode == 0  # back to group_data's value for the tests after this one
    assert server_info(host)["speculative_num_draft_tokens"] == 8


def test_denied_token_fails_preflight_naming_the_gated_drafter_and_changes_nothing(deployed_lab, lab_hosts):
    before = {h.name: (main_pid(h), fleet.ssh(h, f"sha1sum {UNIT_FILE}")) for h in lab_hosts}
    denied = run_deploy(token="hf_lab_denied")
    assert denied.returncode != 0
    for host in lab_hosts:
        assert (f"[{host.name}] {host.name}: the token has no access to the gated repo lab/Kimi-K2.6-DFlash-tiny: "
                f"accept its terms at {HUB_URL}/lab/Kimi-K2.6-DFlash-tiny") in denied.output, denied.output[-3000:]
        assert (main_pid(host), fleet.ssh(host, f"sha1sum {UNIT_FILE}")) == before[host.name]
        assert server_info(host)["speculative_algorithm"] == "DFLASH"  # still serving
    assert operations_started(denied.output) == ["Preflight"], "operations ran after a failed preflight"


def test_the_token_never_appears_in_verbose_debug_output(deployed_lab, lab_hosts):
    verbose = run_deploy("-vvv", "--debug")
    assert verbose.returncode == 0, verbose.output[-3000:]
    assert "hf_lab_granted" not in verbose.output
    assert "Hugging Face token" in verbose.output  # the operation did run
    for host in lab_hosts:
        assert fleet.ssh(host, "stat -c '%a %U' /home/sglang-download/.cache/huggingface/token").split() == \
            ["600", "sglang-download"]


def test_ddtree_needs_a_ddtree_build(deployed_lab, lab_hosts, tmp_path):
    """The 0.5.23 stand-in itself rejects the DDTree flags before any restart; the stand-in built with PR
    #29907's flags deploys. (A release pin, refused by preflight before any fact is read, is a pure test:
    tests/unit/test_preflight_absent_facts.py.)"""
    host = lab_hosts[0]
    pid = main_pid(host)
    plain_wheel = write_group_data(tmp_path / "plain", "lab", (
        "mirrors = copy.deepcopy(base['mirrors'])\n"
        f"mirrors['requirements'] = {{r: 'sglang @ {WHEELS_URL}sglang-0.5.23+lab-py3-none-any.whl' "
        "for r in mirrors['requirements']}"))
    rejected = run_deploy("--limit", host.name, group_data=serving("qwen36_ddtree", plain_wheel))
    assert rejected.returncode != 0
    assert "rejects the rendered flags" in rejected.output and "--speculative-ddtree-budget" in rejected.output
    assert main_pid(host) == pid, "the service was restarted although its flags were rejected"
    assert "retiring" not in rejected.output  # the Kimi unit the Qwen replicas would replace is kept too

    try:
        ddtree = run_deploy("--limit", host.name, group_data=serving("qwen36_ddtree", tmp_path / "qwen"))
        assert ddtree.returncode == 0, ddtree.output[-3000:]
        info = server_info(host)
        assert info["speculative_algorithm"] == "DDTREE" and info["speculative_ddtree_budget"] == 15
    finally:
        assert run_deploy("--limit", host.name).returncode == 0


def test_profiles_without_a_drafter_deploy_verify_and_rerun_and_no_drafter_is_asked_for(deployed_lab, pcie_host,
                                                                                         monkeypatch, tmp_path):
    """qwen36_mtp (Qwen3.6-27B drafting with its own MTP layer, SGLang's EAGLE path) and qwen36_ar (no
    speculation), each a deployment on four of the PCIe host's GPUs: each serves what its profile says, passes
    tests/deployed, and a re-run changes nothing; neither the hub nor its CDN is asked for any drafter. An MTP
    chain the engine would serve otherwise than its profile says is refused by preflight in the engine's words."""
    host = pcie_host
    monkeypatch.setenv("SPECFLEET_LAB_DEPLOYMENTS", json.dumps({host.name: [
        {"profile": "qwen36_mtp", "gpus": [0, 1, 2, 3]}, {"profile": "qwen36_ar", "gpus": [4, 5, 6, 7]}]}))
    lab_data = host_data(host.host_class, lab=True)
    drafters = {lab_data.mirrors["repos"].get(p["drafter"]["repo"], p["drafter"]["repo"]).split("@")[0]
                for p in lab_data.profiles.values() if "drafter" in p}
    mark = len(read_request_log(HUB_STATE))
    try:
        first = run_deploy("--limit", host.name)
        assert first.returncode == 0, first.output[-4000:]
        mtp, ar = server_info(host, 30000), server_info(host, 30004)
        assert (mtp["speculative_algorithm"], mtp["speculative_num_steps"], mtp["speculative_eagle_topk"],
                mtp["speculative_num_draft_tokens"], mtp["speculative_draft_model_path"]) == ("EAGLE", 3, 1, 4, None)
        assert mtp["internal_states"][0]["avg_spec_accept_length"] > 1
        assert ar["speculative_algorithm"] is None
        again = run_deploy("--limit", host.name)
        assert again.returncode == 0 and changed_operations(again.output) == [], again.output[-4000:]
        checks = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/deployed",
                                 "--ignore", "tests/deployed/test_catches_faults.py", "--inventory", LAB_INVENTORY,
                                 "--limit", host.name],
                                cwd=REPO, capture_output=True, text=True, timeout=600,
                                env={**os.environ, "HF_TOKEN": TOKEN_GRANTED})
        assert checks.returncode == 0 and " failed" not in checks.stdout, checks.stdout[-4000:]
        asked = [r["path"] for r in read_request_log(HUB_STATE)[mark:]
                 if any(f"/{repo}/" in r["path"] or r.get("repo") == repo for repo in drafters)]
        assert asked == [], asked[:5]
        # A chain the engine would serve otherwise than the profile says: refused before anything changes.
        chain = write_group_data(tmp_path / "chain", "all", (
            "profiles = copy.deepcopy(base['profiles'])\n"
            "profiles['qwen36_mtp']['speculative']['num_draft_tokens'] = 5"))
        refused = run_deploy("--dry", "--limit", host.name, group_data=chain)
        assert refused.returncode != 0 and (
            f"{host.name}: profile qwen36_mtp: SGLang 0.5.23 would refuse its MTP settings "
            "(sglang@qwen36_mtp-gpu0): speculative_num_draft_tokens is adjusted to speculative_num_steps + 1 when "
            "speculative_eagle_topk == 1 (5 != 3 + 1): set num_draft_tokens 4") in refused.output, \
            refused.output[-3000:]
    finally:
        monkeypatch.delenv("SPECFLEET_LAB_DEPLOYMENTS")
        back = run_deploy("--limit", host.name)
    assert back.returncode == 0, back.output[-3000:]
