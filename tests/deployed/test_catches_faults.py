"""The deployed-host checks catch real faults: break a lab host, run the suite on it, read the
failure, restore the host. The lab is converged again after every test here (the session's
later tests rely on it), which the last test proves with the whole suite on every host.

These run only against the session's lab (no --inventory): they break hosts on purpose.
"""

import json
import re
import shlex
import time

import pytest

from lab import fleet
from lab.config import TOKEN_GRANTED
from deployment.server import capacity
from operations.server import capacity_record
from operations.weights.download import MANIFEST
from tests.deployed.faults import assert_caught, run_suite
from tests.deployed.hosts import LAB_INVENTORY, Target, load_inventory
from tests.helpers import REPO, lab_cli, run_deploy

pytestmark = [pytest.mark.lab, pytest.mark.deployed_faults]


def target_of(host: fleet.LabHost) -> Target:
    return Target(host.name, load_inventory(str(LAB_INVENTORY), str(REPO))[host.name], lab_mode=True)


def server_of(host: fleet.LabHost):
    """The host's first replica: its unit, port and files as the deploy wrote them."""
    return target_of(host).replicas[0]


def wait_generating(host: fleet.LabHost, port: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if fleet.ssh(host, f"curl -s -o /dev/null -w '%{{http_code}}' -m 10 localhost:{port}/health_generate",
                     check=False).strip() == "200":
            return
        time.sleep(1)
    raise AssertionError(f"{host.name}: the server did not generate again within {timeout:.0f}s")


def test_a_stopped_service_is_caught(deployed_lab, pcie_host):
    d = server_of(pcie_host)
    fleet.ssh(pcie_host, f"systemctl stop {d.service_name}")
    try:
        result = run_suite(pcie_host.name)
    finally:
        fleet.ssh(pcie_host, f"systemctl start {d.service_name}")
        wait_generating(pcie_host, d.port)
    assert_caught(result, pcie_host.name, {
        "test_unit_is_enabled_and_active", "test_unit_runs_as_the_service_user",
        "test_unit_listens_on_the_configured_address_and_port", "test_unit_arguments_are_what_group_data_asks_for",
        "test_health_generate_answers_200", "test_chat_completion_returns_text",
        "test_server_info_reports_speculative_decoding_accepting_drafts", "test_metrics_expose_the_accept_length",
        "test_each_replicas_engine_holds_the_kv_tokens_its_deploy_planned",
        "test_each_replica_holds_the_gpus_its_layout_gives_it_and_no_two_share_one",
        "test_the_host_runs_no_sglang_unit_its_deployments_do_not_want",
        "test_every_listener_of_a_replica_is_on_loopback_or_its_bind_address",
    },
        rf"{pcie_host.name}: expected {re.escape(d.service_name)} enabled/active/running, found enabled/inactive/dead",
        rf"{pcie_host.name}: expected {re.escape(d.service_name)} listening on {re.escape(d.engine.service.bind_address)}:{d.port}, found nothing listening",
        rf"{pcie_host.name}: expected 200 from /health_generate on http://127\.0\.0\.1:{d.port} "
        rf"\({re.escape(d.service_name)}\), found None")


def test_a_token_file_readable_by_all_is_caught(deployed_lab, pcie_host):
    d = server_of(pcie_host)
    token = f"{d.engine.service.hf_home}/token"
    fleet.ssh(pcie_host, f"chmod 0644 {token}")
    try:
        result = run_suite(pcie_host.name)
    finally:
        fleet.ssh(pcie_host, f"chmod 0600 {token}")
    assert_caught(result, pcie_host.name, {"test_token_file_is_owned_by_the_download_user_mode_0600"},
                  rf"{pcie_host.name}: expected {re.escape(token)} mode 0600, found mode 0644")
    assert TOKEN_GRANTED not in result.output


def test_a_truncated_weight_shard_is_caught(deployed_lab, pcie_host):
    d = server_of(pcie_host)
    manifest = fleet.ssh(pcie_host, f"cat {d.engine.model_dir}/{MANIFEST}")
    shard = sorted(path for path in json.loads(manifest)["files"] if path.endswith(".safetensors"))[0]
    full, backup = f"{d.engine.model_dir}/{shard}", f"/root/specfleet-fault-{shard.replace('/', '_')}"
    size = json.loads(manifest)["files"][shard]["size"]
    fleet.ssh(pcie_host, f"cp -p {shlex.quote(full)} {backup} && truncate -s {size // 2} {shlex.quote(full)}")
    try:
        result = run_suite(pcie_host.name)
    finally:
        fleet.ssh(pcie_host, f"mv {backup} {shlex.quote(full)}")
    assert_caught(result, pcie_host.name, {"test_weights_are_the_pinned_revision_complete"},
                  rf"{re.escape(full)}: expected {size} bytes \(manifest and hub\), found {size // 2} bytes on disk")
    assert "test_weights_are_the_pinned_revision_complete[lab-pcie-1-drafter]" not in result.output


def test_draft_tokens_edited_by_hand_in_the_unit_are_caught(deployed_lab, pcie_host):
    d = server_of(pcie_host)
    wanted = d.engine.speculative.num_draft_tokens
    edited = 6 if wanted != 6 else 5
    flag = "--speculative-num-draft-tokens"
    backup = f"/root/specfleet-fault-{d.service_name}.service"
    fleet.ssh(pcie_host, f"cp -p {d.unit_file} {backup} && sed -i 's/{flag} {wanted} /{flag} {edited} /' "
                         f"{d.unit_file} && grep -q -- '{flag} {edited} ' {d.unit_file} && "
                         f"systemctl daemon-reload && systemctl restart {d.service_name}")
    try:
        wait_generating(pcie_host, d.port)
        result = run_suite(pcie_host.name)
    finally:
        fleet.ssh(pcie_host, f"mv {backup} {d.unit_file} && systemctl daemon-reload && "
                             f"systemctl restart {d.service_name}")
        wait_generating(pcie_host, d.port)
    # Both the unit's arguments and what the engine serves (its /server_info) say so.
    assert_caught(result, pcie_host.name, {"test_unit_arguments_are_what_group_data_asks_for",
                                           "test_server_info_reports_speculative_decoding_accepting_drafts"},
                  rf"{pcie_host.name}: {re.escape(d.service_name)} runs with other arguments than group_data asks for "
                  rf"\({d.engine.profile_name} on {d.engine.host_class}\):\n{flag}: expected {wanted}, found {edited}",
                  rf"{pcie_host.name}: {d.unit_file} has other arguments than group_data asks for:\n"
                  rf"{flag}: expected {wanted}, found {edited}",
                  rf"{pcie_host.name}: expected {re.escape(d.service_name)}'s /server_info to report "
                  rf"\{{'speculative_num_draft_tokens': {wanted}\b.*found \{{'speculative_num_draft_tokens': {edited}\b")


def test_an_engine_holding_fewer_kv_tokens_than_planned_is_caught(deployed_lab, pcie_host):
    """The plan kept beside the unit says more tokens than the engine sized (as a plan would whose reserve is
    too small for the host): the engine's own max_total_num_tokens is more than the tolerance below it."""
    d = server_of(pcie_host)
    plan_file = capacity_record.path(d)
    kept = fleet.ssh(pcie_host, f"cp -p {plan_file} {plan_file}.kept && cat {plan_file}")
    engine = json.loads(fleet.ssh(pcie_host, f"curl -sf -m 10 -H \"Authorization: Bearer $(cat {d.engine.service.api_key_file} "
                                             f"2>/dev/null)\" localhost:{d.port}/server_info"))["max_total_num_tokens"]
    above = {**json.loads(kept), "planned_tokens": int(engine / (1 - capacity.ENGINE_TOLERANCE)) + 100}
    fleet.ssh(pcie_host, f"printf %s {shlex.quote(json.dumps(above))} > {plan_file}")
    try:
        result = run_suite(pcie_host.name)
    finally:
        fleet.ssh(pcie_host, f"mv {plan_file}.kept {plan_file}")  # the deploy's own file, byte for byte
    assert_caught(result, pcie_host.name, {"test_each_replicas_engine_holds_the_kv_tokens_its_deploy_planned"},
                  rf"{d.service_name}: its engine holds {engine:,} tokens \(max_total_num_tokens in /server_info\), "
                  r"10% fewer than the [\d,]+ planned, beyond the 10% tolerance")


def test_degraded_nvlink_is_caught(deployed_lab, b200_host):
    profile = b200_host.host_class  # the lab's profile for the class (lab/fleet.py CLASSES)
    lab_cli("gpu", b200_host.name, f"{profile}_degraded")
    try:
        result = run_suite(b200_host.name)
    finally:
        lab_cli("gpu", b200_host.name, profile)
    assert_caught(result, b200_host.name, {"test_gpus_and_interconnect_match_the_class"},
                  rf"{b200_host.name}: expected NVLink between every GPU pair \(class b200_nvlink\), "
                  r"found a degraded board")


def test_gpu_runtime_flipped_back_is_caught(deployed_lab, b200_host):
    """The daemons the deploy started are stopped, and the smoke test's record is from another boot."""
    record, backup = target_of(b200_host).deployment.host.smoke.record_path, "/root/specfleet-fault-gpu-smoke.json"
    fleet.ssh(b200_host, f"cp -p {record} {backup} && "
                         f"sed -i 's/\"boot_id\": \"[^\"]*\"/\"boot_id\": \"another-boot\"/' {record} && "
                         "systemctl stop nvidia-persistenced nvidia-fabricmanager")
    try:
        result = run_suite(b200_host.name)
    finally:
        fleet.ssh(b200_host, f"mv {backup} {record} && systemctl start nvidia-persistenced nvidia-fabricmanager")
    assert_caught(result, b200_host.name, {"test_persistence_mode_is_on_for_every_gpu",
                                           "test_fabric_manager_as_the_class_needs",
                                           "test_gpu_smoke_test_passed_in_this_boot"},
                  rf"{b200_host.name}: expected persistence mode Enabled on every GPU, found GPU 0 Disabled",
                  r"fabric State Completed / Status Success \(class b200_nvlink\), found \S+ In Progress/None",
                  r"tested in boot another-boot, this is boot")


def detected_changes(dry_output: str) -> list[str]:
    """Rows of `pyinfra --dry`'s "Detected changes" table where some host would change."""
    table = dry_output.split("--> Detected changes:")[1].split("Detected changes may")[0]
    return [line.strip() for line in table.splitlines()[2:]
            if line.strip() and re.split(r"\s{2,}", line.strip())[1:] != ["-", "-"]]


def test_the_lab_is_converged_again_after_the_faults(deployed_lab, lab_hosts):
    """Every check passes on every host, and the deploy would change nothing (--dry)."""
    result = run_suite(*(host.name for host in lab_hosts))
    assert result.returncode == 0, result.output[-4000:]
    dry = run_deploy("--dry")
    assert dry.returncode == 0, dry.output[-3000:]
    changes = detected_changes(dry.output)
    if changes:
        assert run_deploy().returncode == 0  # converge it for the tests after these
    assert not changes, f"the faults were not undone: a deploy would change {changes}"
