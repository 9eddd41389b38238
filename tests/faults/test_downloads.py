"""Weights under faults: a killed download unit, a dropped deploy, corrupt shards. Nothing fetched twice
that was already complete; every file ends up with the hub's bytes."""

import json
import time

import pytest

from lab import fleet, hub
from lab.services import HUB_STATE
from operations.weights import download
from tests.helpers import run_deploy
from tests.faults.faultlab import (KIMI, SHARDS, TARGET_DIR, TARGET_UNIT, output_of, record, repo_sizes, served_per_file,
                                   start_deploy, wait_for)

pytestmark = pytest.mark.lab

THROTTLE_BPS = 400_000  # a 6-7 MB shard takes 15-18 s, so a kill lands mid-file


@pytest.fixture
def throttled_hub():
    hub.set_faults(HUB_STATE, throttle_bps=THROTTLE_BPS)
    yield
    hub.clear_faults(HUB_STATE)


def fresh_target(host) -> None:
    """A weights directory the deploy has to fetch again (the server keeps running: it loaded at start)."""
    fleet.ssh(host, f"systemctl stop {TARGET_UNIT}; systemctl reset-failed {TARGET_UNIT}; "
                    f"rm -rf {TARGET_DIR}", check=False)


def complete_shards(host) -> list[str]:
    """Shards the fetcher has finished (it moves a file from its .part into place once its hash matched)."""
    out = fleet.ssh(host, f"cd {TARGET_DIR} 2>/dev/null && ls *.safetensors 2>/dev/null", check=False)
    return out.split()


def partial_bytes(host) -> int:
    """Bytes in the download's .part files (the deploy's resumable fetch of large files)."""
    out = fleet.ssh(host, f"du -sb {TARGET_DIR}/.cache/specfleet/parts 2>/dev/null | cut -f1", check=False)
    return int(out.strip() or 0)


def target_complete(host) -> bool:
    manifest = json.loads(fleet.ssh(host, f"cat {TARGET_DIR}/.specfleet-manifest.json"))
    sizes = json.loads(fleet.ssh(host, f"cd {TARGET_DIR} && python3 -c 'import json,os; print(json.dumps("
                                       "{p: os.path.getsize(p) for p in os.listdir(\".\") if os.path.isfile(p)}))'"))
    return all(sizes.get(path) == entry["size"] for path, entry in manifest["files"].items())


def shards_sent(host, before: dict[str, int]) -> dict[str, int]:
    now = served_per_file(KIMI, SHARDS, host)
    return {name: now[name] - before[name] for name in SHARDS}


def refetched(host, before: dict[str, int], sizes: dict[str, int]) -> dict[str, int]:
    """Per file, bytes served to the host since `before` beyond one copy."""
    after = served_per_file(KIMI, sizes, host)
    return {name: after[name] - before.get(name, 0) - sizes[name] for name in sizes}


def test_killed_download_unit_restarts_and_the_same_deploy_completes(deployed_lab, pcie_host, throttled_hub):
    host, sizes = pcie_host, repo_sizes(KIMI)
    fresh_target(host)
    before = served_per_file(KIMI, sizes, host)
    deploy = start_deploy("--limit", host.name)
    try:
        since = fleet.ssh(host, "date +%s").strip()
        # The hub logs a response when its last byte is sent: kill as soon as one shard is through.
        wait_for(lambda: any(v == sizes[n] for n, v in shards_sent(host, before).items()), 90, 0.05,
                 "a first shard to be sent")
        fleet.ssh(host, f"systemctl kill -s KILL {TARGET_UNIT}")
        killed = time.monotonic()
        done = complete_shards(host)  # what the killed process had finished and recorded
        assert 0 < len(done) < len(SHARDS), f"kill did not land mid-download ({done}): lower THROTTLE_BPS"
        rc = deploy.wait(timeout=180)
        recovered = time.monotonic() - killed
    finally:
        if deploy.poll() is None:
            deploy.kill()
    out = output_of(deploy)
    assert rc == 0, out[-3000:]
    journal = fleet.ssh(host, f"journalctl -u {TARGET_UNIT} --since @{since} -o cat --no-pager")
    assert "Scheduled restart job" in journal, journal
    assert target_complete(host)
    extra = refetched(host, before, sizes)
    assert all(extra[name] == 0 for name in done), f"complete shards fetched again: {extra}"
    assert all(v >= 0 for v in extra.values()), extra
    # The files cut mid-transfer continued from their bytes on disk (HTTP Range), not from zero:
    # only what was in flight at the kill (socket buffers) came again.
    assert "resumed model-" in journal, journal
    assert all(v < 512 * 1024 for v in extra.values()), f"a partial file was fetched again from zero: {extra}"
    record("download unit killed", result="unit restarted itself and resumed mid-file; same deploy completed",
           recovered_s=round(recovered, 1), shards_complete_at_kill=len(done),
           bytes_refetched=sum(extra.values()), refetched_files=[n for n, v in extra.items() if v])


def test_dropped_deploy_connection_download_goes_on_and_rerun_attaches(deployed_lab, pcie_host, throttled_hub):
    host, sizes = pcie_host, repo_sizes(KIMI)
    fresh_target(host)
    before = served_per_file(KIMI, sizes, host)
    deploy = start_deploy("--limit", host.name)
    try:
        # Every shard a few seconds into its transfer.
        wait_for(lambda: partial_bytes(host) > 4_000_000, 90, 0.2, "the shards to be under way")
    finally:
        deploy.kill()  # SIGKILL: the controller's SSH connections drop mid-download
        deploy.wait()
    killed = time.monotonic()
    assert complete_shards(host) == [], "a shard finished before the connection dropped"
    # A oneshot unit is "activating" for as long as its download runs.
    assert fleet.ssh(host, f"systemctl is-active {TARGET_UNIT}", check=False).strip() == "activating"
    again = run_deploy("--limit", host.name)
    recovered = time.monotonic() - killed
    assert again.returncode == 0, again.output[-3000:]
    assert target_complete(host)
    extra = refetched(host, before, sizes)
    assert extra == {name: 0 for name in sizes}, f"bytes fetched twice: {extra}"
    record("deploy connection dropped", result="download went on; re-run attached and completed",
           recovered_s=round(recovered, 1), bytes_refetched=0)


def test_truncated_and_bit_flipped_shards_are_fetched_again(deployed_lab, pcie_host):
    host, sizes = pcie_host, repo_sizes(KIMI)
    truncated, flipped = SHARDS[1], SHARDS[2]
    fleet.ssh(host, f"cd {TARGET_DIR} && truncate -s 1000000 {truncated} && python3 -c '"
                    "import os, sys; p = sys.argv[1]; st = os.stat(p); f = open(p, \"r+b\"); f.seek(4096); "
                    "b = f.read(1); f.seek(4096); f.write(bytes([b[0] ^ 0xFF])); f.close(); "
                    f"os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))' {flipped}")

    before, started = served_per_file(KIMI, sizes, host), time.monotonic()
    by_size = run_deploy("--limit", host.name)
    size_s = time.monotonic() - started
    assert by_size.returncode == 0, by_size.output[-3000:]
    after_size = served_per_file(KIMI, sizes, host)
    delta = {n: after_size[n] - before[n] for n in sizes}
    assert delta == {n: sizes[n] if n == truncated else 0 for n in sizes}, delta

    started = time.monotonic()
    by_hash = run_deploy("--limit", host.name, "--data", "verify_weights=true")
    hash_s = time.monotonic() - started
    assert by_hash.returncode == 0, by_hash.output[-3000:]
    after_hash = served_per_file(KIMI, sizes, host)
    delta = {n: after_hash[n] - after_size[n] for n in sizes}
    assert delta == {n: sizes[n] if n == flipped else 0 for n in sizes}, delta
    expected = json.loads((HUB_STATE.parent / "store/models" / KIMI / "manifest.json").read_text())
    sha = {f["path"]: f["sha256"] for f in expected["files"]}[flipped]
    assert fleet.ssh(host, f"sha256sum {TARGET_DIR}/{flipped}").split()[0] == sha
    record("corrupt shard", result="truncated re-fetched by size; flipped re-fetched by verify_weights",
           truncated_recovery_s=round(size_s, 1), truncated_bytes_refetched=sizes[truncated],
           flipped_recovery_s=round(hash_s, 1), flipped_bytes_refetched=sizes[flipped])


HOSTILE = {
    # A commit whose newline would add a root ExecStartPre= line to the download unit.
    "commit": dict(hostile_commit={KIMI: "0" * 40 + "\nExecStartPre=+/usr/bin/touch /tmp/specfleet-pwned"}),
    # A listed name that climbs out of the weights directory into one the service user may write
    # (an LFS file, so the resumable path takes it).
    "listing": dict(hostile_listing={KIMI: "../../../../home/sglang/specfleet-escape.safetensors"}),
}
ESCAPES = ["/home/sglang/specfleet-escape.safetensors", "/tmp/specfleet-pwned"]


@pytest.mark.parametrize("answer", HOSTILE)
def test_hostile_hub_answers_are_refused_before_the_host_changes(deployed_lab, pcie_host, answer, tmp_path,
                                                                 monkeypatch):
    host = pcie_host
    # A controller that kept nothing of this commit (the deploys before kept the honest answer, which a re-run
    # would read instead of the hostile one): the hub's answer is what preflight checks.
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    watched = (f"/etc/systemd/system/{TARGET_UNIT}.service /etc/specfleet/weights-moonshotai--Kimi-K2.6.json "
               f"{TARGET_DIR}/.specfleet-manifest.json")
    before = fleet.ssh(host, f"sha1sum {watched} 2>&1", check=False)
    hub.set_faults(HUB_STATE, **HOSTILE[answer])
    try:
        refused = run_deploy("--limit", host.name)
    finally:
        hub.clear_faults(HUB_STATE)
    assert refused.returncode != 0, refused.output[-3000:]
    assert "refusing" in refused.output, refused.output[-3000:]
    assert fleet.ssh(host, f"sha1sum {watched} 2>&1", check=False) == before  # unit, spec, manifest untouched
    assert fleet.ssh(host, f"ls -d {' '.join(ESCAPES)} 2>/dev/null", check=False).strip() == ""
    record(f"hostile hub {answer}", result="preflight refused the host; nothing on it changed")


def test_bytes_corrupted_in_transit_are_caught_while_they_stream(deployed_lab, pcie_host):
    host, shard = pcie_host, SHARDS[0]
    fresh_target(host)
    since = fleet.ssh(host, "date +%s").strip()
    hub.set_faults(HUB_STATE, corrupt={f"{KIMI}/{shard}": 5000})  # same size: only a hash sees it
    try:
        failed = run_deploy("--limit", host.name)
    finally:
        hub.clear_faults(HUB_STATE)
    assert failed.returncode != 0, failed.output[-3000:]
    journal = fleet.ssh(host, f"journalctl -u {TARGET_UNIT} --since @{since} -o cat --no-pager")
    assert f"sha256 mismatch for {shard}" in journal, journal
    assert f"sha256 mismatch for {shard}" in failed.output, failed.output[-3000:]  # the deploy shows the journal
    assert fleet.ssh(host, f"ls {TARGET_DIR}/{shard} {TARGET_DIR}/.specfleet-manifest.json 2>/dev/null",
                     check=False).strip() == ""  # never put in place, repo not marked complete

    again = run_deploy("--limit", host.name)
    assert again.returncode == 0, again.output[-3000:]
    expected = json.loads((HUB_STATE.parent / "store/models" / KIMI / "manifest.json").read_text())
    sha = {f["path"]: f["sha256"] for f in expected["files"]}[shard]
    assert fleet.ssh(host, f"sha256sum {TARGET_DIR}/{shard}").split()[0] == sha
    record("shard corrupted in transit", result="sha256 mismatch while streaming: deleted, refetched, "
           "unit failed; clean re-run completed")


def test_verify_acts_on_the_hubs_listing_not_a_manifest_the_download_user_can_edit(deployed_lab, pcie_host):
    """The download user owns the manifest: one entry renamed to a root-owned file of the same size
    (with a wrong hash) must not make root hash, let alone delete, that file."""
    host, canary = pcie_host, "/etc/specfleet-canary"
    manifest_file = f"{TARGET_DIR}/.specfleet-manifest.json"
    manifest = json.loads(fleet.ssh(host, f"cat {manifest_file}"))
    size = manifest["files"]["README.md"]["size"]
    manifest["files"]["../../../.." + canary] = {**manifest["files"].pop("README.md"), "sha256": "0" * 64}
    fleet.ssh(host, f"cp -p {manifest_file} /root/specfleet-manifest.bak")
    fleet.ssh(host, f"head -c {size} /dev/urandom > {canary} && runuser -u sglang-download -- python3 -c "
                    f"'import sys; open(sys.argv[1], \"w\").write(sys.argv[2])' {manifest_file} "
                    f"'{json.dumps(manifest)}'")
    try:
        result = run_deploy("--limit", host.name, "--data", "verify_weights=true")
        assert result.returncode == 0, result.output[-3000:]
        assert fleet.ssh(host, f"ls {canary}", check=False).strip() == canary, "root deleted a file it was told to"
        # The manifest did not record README.md: the deploy fetched it again and wrote a true manifest.
        assert "README.md" in json.loads(fleet.ssh(host, f"cat {manifest_file}"))["files"]
    finally:
        fleet.ssh(host, f"rm -f {canary}; test -f {manifest_file} || cp -p /root/specfleet-manifest.bak {manifest_file}; "
                        "rm -f /root/specfleet-manifest.bak")


def test_download_units_are_reloaded_only_when_systemd_holds_a_changed_file(pcie_host):
    """daemon-reload costs ~0.5 s: the weights stage reloads only when a unit systemd holds in memory
    (running, failed) has a changed file; a unit it does not hold is read from its file."""
    host, unit = pcie_host, "specfleet-reload-probe.service"
    path = f"/etc/systemd/system/{unit}"

    def reloaded_by(command: str) -> bool:
        loads = "systemctl show -p UnitsLoadTimestampMonotonic --value"
        before, after = fleet.ssh(host, f"{loads}; {command} >&2; {loads}").split()
        return before != after

    try:
        fleet.ssh(host, f"printf '[Service]\\nType=oneshot\\nExecStart=/bin/false\\n' > {path}")
        assert not reloaded_by(download.reload_if_changed(unit))  # new, not held: read from its file
        fleet.ssh(host, f"systemctl start {unit}", check=False)  # failed: now held in memory
        fleet.ssh(host, f"echo '# changed' >> {path}")
        assert reloaded_by(download.reload_if_changed(unit))
        assert fleet.ssh(host, f"systemctl show -p NeedDaemonReload --value {unit}").strip() == "no"
        assert not reloaded_by(download.reload_if_changed(unit))
    finally:
        fleet.ssh(host, f"systemctl reset-failed {unit}; rm -f {path}; systemctl daemon-reload", check=False)
