"""The lab hub, driven by the real huggingface_hub 2.4 client (no mocks).

The hub runs on 127.0.0.1 on free ports (the `hub` fixture, tests/lab_hub.py); every call passes
endpoint= and an explicit token, so nothing depends on when huggingface_hub read HF_ENDPOINT.
"""

import hashlib
import json
import os
import struct
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.lab_hub import BIG, DRAFTER, KIMI, new_log_entries, repo_files  # sets the client's environment

from huggingface_hub import HfApi, hf_hub_download, snapshot_download
from huggingface_hub.errors import (
    GatedRepoError,
    HfHubHTTPError,
    RemoteEntryNotFoundError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)

from speed.repos import build_bench_repo
from lab import repos
from lab.config import TOKEN_DENIED, TOKEN_GRANTED
from lab.hub import bytes_served, bytes_served_by_repo, read_request_log, set_faults

BAD_TOKEN = "hf_not_a_lab_token"
HF_CLI = Path(sys.executable).with_name("hf")


def assert_same_files(hub, repo_id, local_dir):
    expected = repo_files(hub, repo_id)
    names = sorted(p.relative_to(expected).as_posix() for p in expected.rglob("*") if p.is_file())
    got = sorted(p.relative_to(local_dir).as_posix() for p in Path(local_dir).rglob("*")
                 if p.is_file() and ".cache" not in p.parts)
    assert got == names
    for name in names:
        assert (Path(local_dir) / name).read_bytes() == (expected / name).read_bytes(), name


def download(hub, repo_id, dest, token=False, **kwargs):
    return snapshot_download(repo_id, local_dir=dest, endpoint=hub.url, token=token, **kwargs)


def test_build_is_deterministic_and_idempotent(hub, tmp_path):
    start = time.monotonic()
    assert repos.build_lab_repos(tmp_path) == {k: v for k, v in hub.shas.items() if k != BIG}
    assert time.monotonic() - start < 5
    start = time.monotonic()
    assert build_bench_repo(hub.store, BIG, 24 * 1024 * 1024, shards=1) == hub.shas[BIG]
    assert time.monotonic() - start < 0.5  # already built: nothing rewritten
    for repo_id in hub.shas:
        if repo_id != BIG:
            for f in repo_files(hub, repo_id).rglob("*"):
                assert f.read_bytes() == (tmp_path / "models" / repo_id / "files" / f.name).read_bytes()


def test_snapshot_pinned_and_main_identical_and_rerun_downloads_nothing(hub, tmp_path):
    sha = hub.shas[KIMI]
    download(hub, KIMI, tmp_path / "pinned", revision=sha)
    assert_same_files(hub, KIMI, tmp_path / "pinned")

    download(hub, KIMI, tmp_path / "main")
    assert_same_files(hub, KIMI, tmp_path / "main")
    cached = snapshot_download(KIMI, cache_dir=tmp_path / "cache", endpoint=hub.url, token=False)
    assert Path(cached).name == sha
    assert_same_files(hub, KIMI, cached)

    mark = len(read_request_log(hub.state))
    download(hub, KIMI, tmp_path / "main")
    again = new_log_entries(hub, mark)
    assert [(r["method"], r["path"]) for r in again] == [("GET", f"/api/models/{KIMI}/revision/main")]


def test_sizes_before_download_match_disk(hub, tmp_path):
    api = HfApi(endpoint=hub.url, token=False)
    info = api.model_info(KIMI, files_metadata=True)
    assert info.sha == hub.shas[KIMI] and info.gated is False and info.last_modified is not None
    on_disk = sum(f.stat().st_size for f in repo_files(hub, KIMI).iterdir())
    assert sum(s.size for s in info.siblings) == on_disk

    tree = list(api.list_repo_tree(KIMI, recursive=True))  # 12 entries over pages of 4
    assert sorted(e.path for e in tree) == sorted(s.rfilename for s in info.siblings)
    shard = "model-00001-of-00004.safetensors"
    [paths_info] = api.get_paths_info(KIMI, [shard, "no-such-file"], revision=hub.shas[KIMI])
    assert paths_info.size == (repo_files(hub, KIMI) / shard).stat().st_size
    assert paths_info.lfs.sha256 == hashlib.sha256((repo_files(hub, KIMI) / shard).read_bytes()).hexdigest()


def test_safetensors_index_matches_shards(hub):
    files = repo_files(hub, KIMI)
    index = json.loads((files / "model.safetensors.index.json").read_text())
    tensor_bytes = 0
    for shard in set(index["weight_map"].values()):
        data = (files / shard).read_bytes()
        header_len = struct.unpack("<Q", data[:8])[0]
        header = json.loads(data[8:8 + header_len])
        header.pop("__metadata__")
        assert all(index["weight_map"][name] == shard for name in header)
        end = max(t["data_offsets"][1] for t in header.values())
        assert len(data) == 8 + header_len + end
        tensor_bytes += end
    assert index["metadata"]["total_size"] == tensor_bytes
    config = json.loads((files / "config.json").read_text())
    assert config["model_type"] == "kimi_k25" and config["text_config"]["model_type"] == "kimi_k2"


def test_gated_drafter(hub, tmp_path):
    with pytest.raises(GatedRepoError) as anonymous:
        download(hub, DRAFTER, tmp_path / "anon")
    assert anonymous.value.response.status_code == 401
    with pytest.raises(GatedRepoError) as denied:
        download(hub, DRAFTER, tmp_path / "denied", token=TOKEN_DENIED)
    assert denied.value.response.status_code == 403

    download(hub, DRAFTER, tmp_path / "granted", token=TOKEN_GRANTED)
    assert_same_files(hub, DRAFTER, tmp_path / "granted")
    info = HfApi(endpoint=hub.url).model_info(DRAFTER, token=TOKEN_DENIED)  # metadata stays open
    assert info.gated == "manual"


def test_error_kinds(hub, tmp_path):
    api = HfApi(endpoint=hub.url)
    with pytest.raises(HfHubHTTPError) as invalid:
        api.model_info(KIMI, token=BAD_TOKEN)
    assert invalid.value.response.status_code == 401
    assert not isinstance(invalid.value, RepositoryNotFoundError)
    with pytest.raises(RepositoryNotFoundError):
        api.model_info("lab/no-such-model", token=False)
    with pytest.raises(RevisionNotFoundError):
        api.model_info(KIMI, revision="0" * 40, token=False)
    with pytest.raises(RevisionNotFoundError):
        download(hub, KIMI, tmp_path / "bad-rev", revision="v9")
    with pytest.raises(RemoteEntryNotFoundError):
        hf_hub_download(KIMI, "missing.json", local_dir=tmp_path, endpoint=hub.url, token=False)


def test_whoami(hub):
    assert HfApi(endpoint=hub.url).whoami(token=TOKEN_GRANTED)["name"] == "lab-granted"
    with pytest.raises(HfHubHTTPError):
        HfApi(endpoint=hub.url).whoami(token=BAD_TOKEN)


def fetch(url, headers=None):
    request = urllib.request.Request(url, headers=headers or {})
    opener = urllib.request.build_opener(NoRedirect)
    try:
        with opener.open(request) as response:
            return response.status, response.headers, response.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers, e.read()


class NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args):
        return None


@pytest.mark.parametrize("method, path, token, status, code", [
    # What hfhub.md section 2 says the real hub answers a plain request, which the deploy's no-op sends
    # (operations/weights/hub_requests.py): the token's check, and a file's HEAD for each repo's access.
    ("GET", "/api/whoami-v2", TOKEN_GRANTED, 200, None),
    ("GET", "/api/whoami-v2", BAD_TOKEN, 401, None),
    ("GET", "/api/whoami-v2", None, 401, None),
    ("HEAD", "/{drafter}/resolve/{drafter_sha}/config.json", TOKEN_GRANTED, 200, None),
    ("HEAD", "/{drafter}/resolve/{drafter_sha}/config.json", TOKEN_DENIED, 403, "GatedRepo"),
    ("HEAD", "/{drafter}/resolve/{drafter_sha}/config.json", None, 401, "GatedRepo"),
    ("HEAD", "/{drafter}/resolve/{drafter_sha}/config.json", BAD_TOKEN, 401, None),
    ("HEAD", "/{kimi}/resolve/{kimi_sha}/model-00001-of-00004.safetensors", TOKEN_GRANTED, 302, None),
    ("HEAD", "/{kimi}/resolve/{zeros}/config.json", TOKEN_GRANTED, 404, "RevisionNotFound"),
    ("HEAD", "/{kimi}/resolve/{kimi_sha}/missing.json", TOKEN_GRANTED, 404, "EntryNotFound"),
    ("HEAD", "/lab/no-such-model/resolve/{kimi_sha}/config.json", TOKEN_GRANTED, 404, "RepoNotFound"),
    ("HEAD", "/lab/no-such-model/resolve/{kimi_sha}/config.json", None, 401, "RepoNotFound"),
])
def test_plain_requests_are_answered_as_the_real_hub_answers_them(hub, method, path, token, status, code):
    url = hub.url + path.format(drafter=DRAFTER, drafter_sha=hub.shas[DRAFTER], kimi=KIMI, kimi_sha=hub.shas[KIMI],
                                zeros="0" * 40)
    request = urllib.request.Request(url, method=method, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.build_opener(NoRedirect).open(request) as response:
            got, headers = response.status, response.headers
    except urllib.error.HTTPError as answer:
        got, headers = answer.code, answer.headers
    assert (got, headers.get("X-Error-Code")) == (status, code)
    if token == BAD_TOKEN:
        assert headers["X-Error-Message"] == "Invalid credentials in Authorization header"
    if method == "HEAD" and status in (200, 302) or code == "EntryNotFound":  # the commit a file resolved at
        assert headers["X-Repo-Commit"] == hub.shas[DRAFTER if "{drafter}" in path else KIMI]


def test_range_and_cdn(hub):
    readme = (repo_files(hub, KIMI) / "README.md").read_bytes()
    status, headers, body = fetch(f"{hub.url}/{KIMI}/resolve/main/README.md", {"Range": "bytes=10-19"})
    assert (status, body) == (206, readme[10:20])
    assert headers["Content-Range"] == f"bytes 10-19/{len(readme)}"
    assert headers["X-Repo-Commit"] == hub.shas[KIMI]

    status, headers, _ = fetch(f"{hub.url}/{DRAFTER}/resolve/main/model.safetensors",
                               {"Authorization": f"Bearer {TOKEN_GRANTED}"})
    assert status == 302 and "X-Xet-Hash" not in headers
    cdn = headers["Location"]
    assert f":{hub.cdn_port}/" in cdn and int(headers["X-Linked-Size"]) > 0
    assert fetch(cdn, {"Authorization": f"Bearer {TOKEN_GRANTED}"})[0] == 400  # S3 refuses a second auth
    assert fetch(cdn.replace("sig=", "sig=0"))[0] == 403  # links can't be forged past the gate
    status, headers, body = fetch(cdn, {"Range": "bytes=-8"})
    assert status == 206 and body == (repo_files(hub, DRAFTER) / "model.safetensors").read_bytes()[-8:]


def test_throttle(hub):
    shard = "model-00002-of-00004.safetensors"
    size = (repo_files(hub, KIMI) / shard).stat().st_size
    set_faults(hub.state, throttle_bps=int(size / 1.5))
    start = time.monotonic()
    with tempfile.TemporaryDirectory() as dest:
        hf_hub_download(KIMI, shard, local_dir=dest, endpoint=hub.url, token=False)
    assert 1.3 < time.monotonic() - start < 6  # 1.5 s at the set rate; slack for a busy machine


def test_upload_limit_is_shared_by_every_response_and_the_log_counts_bytes_per_repo(hub):
    """upload_bps caps the hub's whole upload (a site's uplink), not each response: two shards fetched at once at
    the rate that sends one in 1 s take 2 s together, as throttle_bps would let them take 1 s."""
    shards = ("model-00002-of-00004.safetensors", "model-00003-of-00004.safetensors")
    sizes = [(repo_files(hub, KIMI) / shard).stat().st_size for shard in shards]
    set_faults(hub.state, upload_bps=max(sizes))
    mark = len(read_request_log(hub.state))
    start = time.monotonic()
    with tempfile.TemporaryDirectory() as dest:
        threads = [threading.Thread(target=hf_hub_download, args=(KIMI, shard),
                                    kwargs=dict(local_dir=dest, endpoint=hub.url, token=False)) for shard in shards]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    assert 1.8 < time.monotonic() - start < 8  # sum(sizes) / max(sizes) s at the set rate; slack for a busy machine
    assert bytes_served_by_repo(new_log_entries(hub, mark)) == {KIMI: sum(sizes)}


def test_dropped_connection_is_resumed_in_process(hub, tmp_path):
    shard = "model-00003-of-00004.safetensors"
    set_faults(hub.state, drop_after={shard: 2_000_000})
    mark = len(read_request_log(hub.state))
    download(hub, KIMI, tmp_path)
    assert_same_files(hub, KIMI, tmp_path)
    gets = [r for r in new_log_entries(hub, mark) if r["server"] == "cdn" and shard in r["path"]]
    assert [r["bytes_sent"] for r in gets] == [2_000_000, (repo_files(hub, KIMI) / shard).stat().st_size]

    # Over 10 MiB the client resumes with Range from its last whole 10 MiB chunk.
    big = "model-00001-of-00001.safetensors"
    set_faults(hub.state, drop_after={big: 22 * 1024 * 1024})
    mark = len(read_request_log(hub.state))
    download(hub, BIG, tmp_path / "big")
    assert_same_files(hub, BIG, tmp_path / "big")
    gets = [r for r in new_log_entries(hub, mark) if r["server"] == "cdn"]
    assert [(r["status"], r["range"]) for r in gets] == [(200, None), (206, "bytes=20971520-")]


def test_corrupt_byte_is_caught_by_checksums(hub, tmp_path):
    shard = "model-00004-of-00004.safetensors"
    set_faults(hub.state, corrupt={shard: 1000})
    download(hub, KIMI, tmp_path)
    original = (repo_files(hub, KIMI) / shard).read_bytes()
    got = (tmp_path / shard).read_bytes()
    assert len(got) == len(original) and got != original  # the client only checks sizes
    result = HfApi(endpoint=hub.url).verify_repo_checksums(KIMI, local_dir=tmp_path, token=False)
    assert [m["path"] for m in result.mismatches] == [shard]


def test_outage(hub):
    set_faults(hub.state, gone=True)
    with pytest.raises(HfHubHTTPError) as outage:
        HfApi(endpoint=hub.url).model_info(KIMI, token=False)
    assert outage.value.response.status_code == 503


def test_concurrent_clients(hub, tmp_path):
    errors = []

    def one_host(i):
        try:
            download(hub, KIMI, tmp_path / str(i), max_workers=8)
        except Exception as e:  # reported below, with the host's number
            errors.append((i, e))

    hosts = [threading.Thread(target=one_host, args=(i,)) for i in range(8)]
    for t in hosts:
        t.start()
    for t in hosts:
        t.join()
    assert errors == []
    for i in range(8):
        assert_same_files(hub, KIMI, tmp_path / str(i))
    shard = repo_files(hub, KIMI) / "model-00001-of-00004.safetensors"
    assert bytes_served(hub.state, shard.name) >= 8 * shard.stat().st_size


def test_hf_cli_download_with_token(hub, tmp_path):
    env = {**os.environ, "HF_ENDPOINT": hub.url, "HF_TOKEN": TOKEN_GRANTED, "HF_HOME": str(tmp_path / "home")}
    done = subprocess.run([HF_CLI, "download", DRAFTER, "--local-dir", tmp_path / "d"], env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert_same_files(hub, DRAFTER, tmp_path / "d")

    env["HF_TOKEN"] = TOKEN_DENIED
    refused = subprocess.run([HF_CLI, "download", DRAFTER, "--local-dir", tmp_path / "e"], env=env,
                             capture_output=True, text=True, timeout=60)
    assert refused.returncode == 1


def test_log_records_auth_kind_never_the_token(hub):
    api = HfApi(endpoint=hub.url)
    for token in (False, TOKEN_GRANTED, TOKEN_DENIED):
        api.model_info(KIMI, token=token)
    with pytest.raises(HfHubHTTPError):
        api.model_info(KIMI, token=BAD_TOKEN)
    log_text = (hub.state / "requests.jsonl").read_text()
    for token in (TOKEN_GRANTED, TOKEN_DENIED, BAD_TOKEN):
        assert token not in log_text
    assert [r["auth"] for r in read_request_log(hub.state)[-4:]] == ["none", "granted", "denied", "invalid"]
