"""Preflight refuses a host it cannot serve, naming the cause and the fix, before changing or fetching anything."""

import time

import pytest

from lab import fleet
from lab.config import HUB_URL
from tests.helpers import UNIT_FILE, run_deploy
from tests.faults.faultlab import DRAFTER_DIR, KIMI, KIMI_DRAFTER, TARGET_DIR, http_status, record, repo_sizes, served
from tests.helpers import main_pid, operations_started

pytestmark = pytest.mark.lab

TOKEN_FILE = "/home/sglang-download/.cache/huggingface/token"  # the download user's


def host_state(host) -> tuple:
    """What a refused deploy must leave as it was: the server process, its unit, the token file."""
    return (main_pid(host), fleet.ssh(host, f"sha1sum {UNIT_FILE} {TOKEN_FILE}"))


def test_gated_drafter_refused_and_the_running_service_still_answers(deployed_lab, lab_hosts):
    before = {h.name: host_state(h) for h in lab_hosts}
    weights_before = served(".safetensors")
    started = time.monotonic()
    denied = run_deploy(token="hf_lab_denied")
    record("gated drafter", result="refused", refused_after_s=round(time.monotonic() - started, 1),
           bytes_refetched=served(".safetensors") - weights_before)
    assert denied.returncode != 0
    assert operations_started(denied.output) == ["Preflight"]
    for host in lab_hosts:
        assert f"[{host.name}] {host.name}: the token has no access to the gated repo {KIMI_DRAFTER}" \
            in denied.output
        assert f"accept its terms at {HUB_URL}/{KIMI_DRAFTER}" in denied.output
        # The denied token did not replace the working one; the server was not restarted and answers.
        assert host_state(host) == before[host.name]
        assert http_status(host) == 200
    assert served(".safetensors") == weights_before, "a refused host downloaded weights"


def test_invalid_token_refused_saying_how_to_create_one(deployed_lab, lab_hosts):
    before = {h.name: host_state(h) for h in lab_hosts}
    invalid = run_deploy(token="hf_invalid")
    assert invalid.returncode != 0
    assert operations_started(invalid.output) == ["Preflight"]
    for host in lab_hosts:
        assert (f"[{host.name}] {host.name}: the Hugging Face token is invalid (401 from {HUB_URL}): "
                "create a read token at https://huggingface.co/settings/tokens and export HF_TOKEN") \
            in invalid.output, invalid.output[-3000:]
        assert host_state(host) == before[host.name]
        assert http_status(host) == 200
    assert "hf_invalid" not in invalid.output
    record("bad token", result="refused")


def test_weights_dir_on_a_small_filesystem_refused_before_any_download(deployed_lab, pcie_host):
    host = pcie_host
    fleet.ssh(host, "mkdir -p /mnt/small && mount -t tmpfs -o size=4m specfleet-small /mnt/small")
    before, weights_before = host_state(host), served(".safetensors")
    try:
        small = run_deploy("--limit", host.name, "--data", "weights_dir=/mnt/small")
        left = fleet.ssh(host, "find /mnt/small -mindepth 1 | head -5")
    finally:
        fleet.ssh(host, "umount /mnt/small && rmdir /mnt/small")
    assert small.returncode != 0
    assert operations_started(small.output) == ["Preflight"]
    needed = sum(repo_sizes(KIMI).values()) + sum(repo_sizes(KIMI_DRAFTER).values())
    line = next((l for l in small.output.splitlines() if "the weights need" in l), "")
    # Bytes needed, bytes free and the path, exactly.
    revisions = f"{TARGET_DIR.rsplit('/', 2)[1]}/{TARGET_DIR.rsplit('/', 1)[1]}", \
        f"{DRAFTER_DIR.rsplit('/', 2)[1]}/{DRAFTER_DIR.rsplit('/', 1)[1]}"  # each revision's own directory
    assert f"({needed} bytes) more in /mnt/small/{revisions[0]}, /mnt/small/{revisions[1]}" in line, small.output[-3000:]
    assert "the filesystem holding /mnt/small has 0.0 GB (4194304 bytes) free" in line, line
    assert left == "", "the refused deploy wrote into the weights directory"
    assert served(".safetensors") == weights_before, "weights were fetched although the disk is too small"
    assert host_state(host) == before and http_status(host) == 200
    record("disk too small", result="refused", bytes_needed=needed, bytes_free=4194304, bytes_fetched=0)
