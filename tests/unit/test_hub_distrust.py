"""The deploy's distrust of a hostile hub: preflight's snapshot and the host's fetcher, against the lab hub.

Product code (operations/weights/hub.py, operations/weights/host_scripts/fetch_weights.py) run on the controller; the
lab hub (the `hub` fixture, tests/lab_hub.py) serves the hostile listings, commits and bytes.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.lab_hub import DRAFTER, KIMI, new_log_entries, repo_files  # sets the client's environment

from huggingface_hub import HfApi

from lab.config import TOKEN_GRANTED
from lab.hub import read_request_log, set_faults
from operations.weights.hub import HubProblem, snapshot
from tests.helpers import host_programs_importable

host_programs_importable()
import fetch_weights  # noqa: E402

SHARD = "model-00002-of-00004.safetensors"


@pytest.mark.parametrize("name", ["../specfleet-escape.safetensors", "/tmp/specfleet-escape.safetensors"])
def test_hostile_listing_is_served_and_refused_by_preflight(hub, name):
    set_faults(hub.state, hostile_listing={KIMI: name})
    info = HfApi(endpoint=hub.url).model_info(KIMI, files_metadata=True, token=False)
    assert name in [s.rfilename for s in info.siblings]  # the knob works: the client takes it as listed
    with pytest.raises(HubProblem, match="file listing specfleet will not write") as refused:
        snapshot.__wrapped__(hub.url, None, KIMI, hub.shas[KIMI])
    assert repr(name) in str(refused.value)


@pytest.mark.parametrize("commit, problem", [
    ("0" * 40 + "\nExecStartPre=+/usr/bin/touch /tmp/specfleet-pwned", "not 40 hex digits"),
    ("1" * 40, "another commit"),
])
def test_hostile_commit_is_served_and_refused_by_preflight(hub, commit, problem):
    set_faults(hub.state, hostile_commit={KIMI: commit})
    assert HfApi(endpoint=hub.url).model_info(KIMI, revision=hub.shas[KIMI], token=False).sha == commit
    with pytest.raises(HubProblem, match=problem):
        snapshot.__wrapped__(hub.url, None, KIMI, hub.shas[KIMI])


def test_snapshot_of_an_honest_hub_passes(hub):
    snap = snapshot.__wrapped__(hub.url, None, KIMI, "main")
    assert snap.commit == hub.shas[KIMI] and len(snap.files) == 12 and snap.config["model_type"] == "kimi_k25"


def fetch_spec(hub, tmp_path, repo_id=KIMI, extra=(), token=None) -> dict:
    snap = snapshot.__wrapped__(hub.url, token, repo_id, hub.shas[repo_id])
    return {"repo_id": repo_id, "commit": snap.commit, "local_dir": str(tmp_path / "weights"),
            "files": [{"path": f.path, "size": f.size, "sha256": f.sha256, "git_sha1": f.git_sha1}
                      for f in snap.files] + list(extra)}


def test_fetcher_refuses_a_hostile_listing_before_writing_anything(hub, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    spec = fetch_spec(hub, tmp_path, extra=[{"path": "../escape.safetensors", "size": 1, "sha256": "0" * 64,
                                             "git_sha1": None}])
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    mark = len(read_request_log(hub.state))
    assert fetch_weights.main(str(tmp_path / "spec.json")) == 1
    assert "refusing the listing" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["spec.json", "weights"]
    assert list((tmp_path / "weights").iterdir()) == [] and new_log_entries(hub, mark) == []


def shard_entry(spec: dict) -> dict:
    return next(e for e in spec["files"] if e["path"] == SHARD)


def test_resumable_fetch_hashes_as_it_streams(hub, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    spec = fetch_spec(hub, tmp_path)
    local_dir = Path(spec["local_dir"])
    local_dir.mkdir()
    assert fetch_weights.fetch_resumable(spec, shard_entry(spec), local_dir, None) == \
        f"fetched {SHARD} (sha256 checked)"
    assert (local_dir / SHARD).read_bytes() == (repo_files(hub, KIMI) / SHARD).read_bytes()


def test_bytes_that_hash_wrong_are_deleted_refetched_then_refused(hub, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    spec = fetch_spec(hub, tmp_path)
    local_dir = Path(spec["local_dir"])
    local_dir.mkdir()
    set_faults(hub.state, corrupt={SHARD: 5000})  # same size, one byte flipped: only a hash sees it
    mark = len(read_request_log(hub.state))
    with pytest.raises(fetch_weights.HashMismatch):
        fetch_weights.fetch_resumable(spec, shard_entry(spec), local_dir, None)
    assert capsys.readouterr().out.count(f"sha256 mismatch for {SHARD}") == 2
    assert not (local_dir / SHARD).exists() and not list((local_dir / fetch_weights.PARTS).iterdir())
    assert len([r for r in new_log_entries(hub, mark) if r["server"] == "cdn"]) == fetch_weights.ATTEMPTS


def test_a_resumed_part_is_hashed_from_its_first_byte(hub, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    spec = fetch_spec(hub, tmp_path)
    local_dir = Path(spec["local_dir"])
    original = (repo_files(hub, KIMI) / SHARD).read_bytes()
    part = local_dir / fetch_weights.PARTS / f"{SHARD}.part"
    part.parent.mkdir(parents=True)
    part.write_bytes(original[:100] + bytes([original[100] ^ 0xFF]) + original[101:2_000_000])  # a bad prefix

    mark = len(read_request_log(hub.state))
    assert fetch_weights.fetch_resumable(spec, shard_entry(spec), local_dir, None) == \
        f"fetched {SHARD} (sha256 checked)"
    assert f"sha256 mismatch for {SHARD}" in capsys.readouterr().out
    assert (local_dir / SHARD).read_bytes() == original
    cdn = [(r["status"], r["range"]) for r in new_log_entries(hub, mark) if r["server"] == "cdn"]
    assert cdn == [(206, "bytes=2000000-"), (200, None)]  # resumed, caught, fetched again whole


def run_fetcher(hub, spec: dict, spec_path: Path, token: str | None) -> subprocess.CompletedProcess:
    """The fetcher as its unit runs it, but with `-S`: no site-packages, the standard library alone."""
    spec_path.write_text(json.dumps(spec))
    env = {"PATH": os.environ["PATH"], "HF_ENDPOINT": hub.url, "HF_HOME": str(spec_path.parent / "hf-home")}
    if token:
        env["HF_TOKEN"] = token
    return subprocess.run([sys.executable, "-S", fetch_weights.__file__, str(spec_path)], env=env,
                          capture_output=True, text=True, timeout=60)


def test_fetcher_puts_every_file_in_place_hashed_with_the_standard_library_alone(hub, tmp_path):
    spec = fetch_spec(hub, tmp_path, repo_id=DRAFTER, token=TOKEN_GRANTED)  # gated: the token must reach the hub
    mark = len(read_request_log(hub.state))
    done = run_fetcher(hub, spec, tmp_path / "spec.json", TOKEN_GRANTED)
    assert done.returncode == 0, done.stderr
    assert "(git sha1 checked)" in done.stdout and "(sha256 checked)" in done.stdout
    local_dir = Path(spec["local_dir"])
    assert set(json.loads((local_dir / ".specfleet-manifest.json").read_text())["files"]) == \
        {e["path"] for e in spec["files"]}
    for entry in spec["files"]:
        assert (local_dir / entry["path"]).read_bytes() == (repo_files(hub, DRAFTER) / entry["path"]).read_bytes()
    served = new_log_entries(hub, mark)
    assert {(r["server"], r["auth"]) for r in served} == {("hub", "granted"), ("cdn", "none")}  # never to the CDN

    mark = len(read_request_log(hub.state))
    again = run_fetcher(hub, spec, tmp_path / "spec.json", TOKEN_GRANTED)
    assert again.returncode == 0 and new_log_entries(hub, mark) == []  # all in place: nothing fetched
    assert (local_dir / ".specfleet-manifest.json").is_file()


def test_a_small_file_corrupted_in_transit_is_caught_by_its_git_hash(hub, tmp_path):
    spec = fetch_spec(hub, tmp_path)
    set_faults(hub.state, corrupt={f"{KIMI}/config.json": 10})  # same size: only the git blob hash sees it
    failed = run_fetcher(hub, spec, tmp_path / "spec.json", None)
    assert failed.returncode == 1
    assert "git sha1 mismatch for config.json" in failed.stdout and "config.json" in failed.stderr
    local_dir = Path(spec["local_dir"])
    assert not (local_dir / "config.json").exists() and not (local_dir / ".specfleet-manifest.json").exists()
    assert (local_dir / SHARD).read_bytes() == (repo_files(hub, KIMI) / SHARD).read_bytes()  # the rest went on
