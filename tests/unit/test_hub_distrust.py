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

from tests.lab_hub import DRAFTER, KIMI, QWEN, QWEN_RETRAINED, new_log_entries, repo_files  # sets the client's environment

from huggingface_hub import HfApi

from lab.config import TOKEN_GRANTED
from lab.hub import clear_faults, read_request_log, set_faults
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


def test_hosts_asking_the_same_snapshot_at_once_cost_the_hub_one_ask(hub):
    """pyinfra runs each host's deploy.py side by side: the hosts that ask for a repo's snapshot while the
    first one's requests are under way wait for its answer, so a no-op asks the hub once per run, not per host."""
    import threading
    mark = len(new_log_entries(hub, 0))
    answers = []
    hosts = [threading.Thread(target=lambda: answers.append(snapshot(hub.url, None, KIMI, hub.shas[KIMI])))
             for _ in range(3)]
    for thread in hosts:
        thread.start()
    for thread in hosts:
        thread.join()
    assert len(answers) == 3 and answers[0] is answers[1] is answers[2]
    asked = [r["path"] for r in new_log_entries(hub, mark)]
    assert asked.count(f"/api/models/{KIMI}/revision/{hub.shas[KIMI]}") == 1, asked


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
    assert fetch_weights.fetch_resumable(spec, shard_entry(spec), local_dir, None, fetch_weights.Placed(local_dir)) == \
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
        fetch_weights.fetch_resumable(spec, shard_entry(spec), local_dir, None, fetch_weights.Placed(local_dir))
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
    assert fetch_weights.fetch_resumable(spec, shard_entry(spec), local_dir, None, fetch_weights.Placed(local_dir)) == \
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


def test_weights_of_a_new_commit_are_hashed_not_kept_for_their_size(hub, tmp_path):
    """The pin moves to a retrained revision whose shards keep their names and sizes: the directory's
    manifest recorded the old sha256 for them, so they are hashed, found different and fetched again,
    never kept under a manifest naming the new commit."""
    old = fetch_spec(hub, tmp_path, repo_id=QWEN)
    assert run_fetcher(hub, old, tmp_path / "spec.json", None).returncode == 0
    new = fetch_spec(hub, tmp_path, repo_id=QWEN_RETRAINED)  # into the same directory, as a mirror swap does
    same_size = {e["path"] for e in new["files"] for o in old["files"]
                 if e["path"] == o["path"] and e["size"] == o["size"] and e["sha256"] and e["sha256"] != o["sha256"]}
    assert same_size == {"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"}  # the case itself

    new_files = {e["path"]: e for e in new["files"]}
    mark = len(read_request_log(hub.state))
    done = run_fetcher(hub, new, tmp_path / "spec.json", None)
    assert done.returncode == 0, done.stderr
    local_dir = Path(new["local_dir"])
    for path in new_files:
        assert (local_dir / path).read_bytes() == (repo_files(hub, QWEN_RETRAINED) / path).read_bytes(), path
    assert json.loads((local_dir / ".specfleet-manifest.json").read_text())["commit"] == new["commit"]
    fetched = {r["path"].rsplit("/", 1)[-1] for r in new_log_entries(hub, mark) if r["server"] == "cdn"}
    assert fetched == same_size  # the unchanged files were proven by their recorded hashes, not fetched


def test_a_resumed_fetch_trusts_the_files_it_put_in_place_and_hashes_only_small_ones(hub, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    spec = fetch_spec(hub, tmp_path)
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    set_faults(hub.state, corrupt={f"{KIMI}/config.json": 10})
    assert fetch_weights.main(str(tmp_path / "spec.json")) == 1  # the shards went in place, config.json did not
    local_dir = Path(spec["local_dir"])
    journal = [json.loads(line) for line in (local_dir / fetch_weights.PLACED).read_text().splitlines()]
    assert SHARD in {record["path"] for record in journal}

    clear_faults(hub.state)
    hashed = []
    real_hash = fetch_weights.weights_manifest.hash_file
    monkeypatch.setattr(fetch_weights.weights_manifest, "hash_file",
                        lambda path, entry, **kw: hashed.append(entry["path"]) or real_hash(path, entry, **kw))
    assert fetch_weights.main(str(tmp_path / "spec.json")) == 0
    assert hashed and all(not entry["sha256"] for entry in spec["files"] if entry["path"] in hashed), hashed
    assert not (local_dir / fetch_weights.PLACED).exists() and (local_dir / ".specfleet-manifest.json").is_file()


def test_a_new_revision_links_what_the_previous_one_holds_and_fetches_only_what_changed(hub, tmp_path):
    """Each revision in its own directory: the retrained one links the files whose hash and size the
    previous revision's manifest recorded (config, tokenizer: the same inode), and fetches its shards;
    the previous revision keeps its own bytes."""
    repo_dir = tmp_path / "Qwen--Qwen3.6-27B"
    old = {**fetch_spec(hub, tmp_path, repo_id=QWEN), "revisions_dir": str(repo_dir)}
    old["local_dir"] = str(repo_dir / old["commit"])
    assert run_fetcher(hub, old, tmp_path / "spec.json", None).returncode == 0
    new = {**fetch_spec(hub, tmp_path, repo_id=QWEN_RETRAINED), "revisions_dir": str(repo_dir)}
    new["local_dir"] = str(repo_dir / new["commit"])
    mark = len(read_request_log(hub.state))
    done = run_fetcher(hub, new, tmp_path / "spec.json", None)
    assert done.returncode == 0, done.stderr
    fetched = {r["path"].rsplit("/", 1)[-1] for r in new_log_entries(hub, mark) if r["server"] == "cdn"}
    assert fetched == {"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"}
    old_dir, new_dir = Path(old["local_dir"]), Path(new["local_dir"])
    for entry in new["files"]:
        path = entry["path"]
        assert (new_dir / path).read_bytes() == (repo_files(hub, QWEN_RETRAINED) / path).read_bytes(), path
        same_inode = (new_dir / path).stat().st_ino == (old_dir / path).stat().st_ino
        assert same_inode == (path not in fetched), path
        assert (old_dir / path).read_bytes() == (repo_files(hub, QWEN) / path).read_bytes(), path
    assert f"linked config.json from {old['commit']}" in done.stdout
