"""A pinned commit's listing and config kept on the controller (operations/weights/hub_cache.py), the token and the
access still asked of the hub with plain requests (hub_requests.py): against the lab hub on 127.0.0.1 (the `hub`
fixture), as huggingface_hub's client path answers them (operations/weights/hub.py)."""

import http.server
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import fields
from pathlib import Path

import pytest

from tests.lab_hub import DRAFTER, KIMI, QWEN, QWEN_RETRAINED, new_log_entries  # sets the client's environment

from lab.config import TOKEN_DENIED, TOKEN_GRANTED
from lab.hub import read_request_log, set_faults
from deployment.hosts import resolve
from operations.weights import checks, hub_cache, hub_requests
from operations.weights import hub as weights_hub
from operations.weights.checks import hub_state, token_problem
from operations.weights.hub import AccessPending, HubProblem, RepoSnapshot, kept
from tests.unit.group_data import host_data

REPO = Path(__file__).resolve().parents[2]
REVOKED = "hf_lab_revoked"  # a token the hub does not know (any more)


@pytest.fixture(autouse=True)
def each_call_a_run(monkeypatch):
    """Each call asks as a run of its own would: what once_per_run kept of an earlier call is not its answer."""
    for module, name in ((weights_hub, "snapshot"), (weights_hub, "whoami"), (weights_hub, "repo_snapshot"),
                         (checks, "whoami"), (checks, "repo_snapshot")):
        monkeypatch.setattr(module, name, getattr(module, name).__wrapped__)


def take(endpoint: str, token: str | None, repo_id: str, revision: str) -> RepoSnapshot:
    """The repo as the deploy takes it: from the controller's cache once kept, else from the hub's client."""
    return weights_hub.repo_snapshot(endpoint, token, repo_id, revision)


def ask_client(endpoint: str, token: str | None, repo_id: str, revision: str) -> RepoSnapshot:
    """The repo as huggingface_hub's client answers it, the cache aside."""
    return weights_hub.snapshot(endpoint, token, repo_id, revision)


@pytest.fixture
def cache_home(monkeypatch) -> Path:
    """XDG_CACHE_HOME of the test's own, in the user's home: every directory above it is the user's or root's and
    closed to others, as the cache requires (the temporary directory, writable by everyone, is not)."""
    home = Path(tempfile.mkdtemp(prefix=".specfleet-test-cache-", dir=Path.home()))
    monkeypatch.setenv("XDG_CACHE_HOME", str(home))
    assert hub_cache.directory() == str(home / "specfleet" / "hub"), "the home directory is open to other users"
    yield home
    shutil.rmtree(home)


def entries(cache_home: Path) -> list[Path]:
    return sorted((cache_home / "specfleet" / "hub").glob("*.json"))


def entry_of(hub, repo_id: str) -> Path:
    return Path(hub_cache.directory()) / hub_cache.entry_name(hub.url, repo_id, hub.shas[repo_id])


def asked_paths(hub, mark: int, at_least: int = 1) -> list[str]:
    """The hub's requests since MARK, once it logged AT_LEAST (it logs each after answering it)."""
    deadline = time.monotonic() + 5
    while True:
        asked = [f"{r['method']} {r['path']}" for r in new_log_entries(hub, mark)]
        if len(asked) >= at_least or time.monotonic() > deadline:
            return asked
        time.sleep(0.01)


def lab_weights(hub):
    return resolve(host_data("b200_nvlink", lab=True, hf_endpoint=hub.url), "b200_nvlink").weights


RUN = """
import json, sys
from deployment.hosts import resolve
from operations.weights.checks import hub_state
from tests.unit.group_data import host_data
state = hub_state(resolve(host_data("b200_nvlink", lab=True, hf_endpoint=sys.argv[1]), "b200_nvlink").weights)
print(json.dumps({"client": "huggingface_hub" in sys.modules, "problems": state.problems, "pending": state.pending,
                  "snapshots": {role: [s.commit, s.listing(), s.config] for role, s in state.snapshots.items()}}))
"""


def deploy_run(hub, token: str) -> dict:
    """hub_state in a process of its own, as a deploy runs it: what it found, and whether it imported the client."""
    done = subprocess.run([sys.executable, "-c", RUN, hub.url], cwd=REPO, capture_output=True, text=True,
                          env={**os.environ, "HF_TOKEN": token}, timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_a_pinned_commit_is_read_from_the_hub_once_and_a_rerun_imports_no_hub_client(hub, cache_home):
    mark = len(read_request_log(hub.state))
    first = deploy_run(hub, TOKEN_GRANTED)
    assert first["client"] and first["problems"] == first["pending"] == [] and set(first["snapshots"]) == {
        "target", "drafter"}
    assert f"GET /api/models/{KIMI}/revision/{hub.shas[KIMI]}" in asked_paths(hub, mark)
    assert len(entries(cache_home)) == 2

    mark = len(read_request_log(hub.state))
    again = deploy_run(hub, TOKEN_GRANTED)
    assert not again["client"] and again["snapshots"] == first["snapshots"] and again["problems"] == []
    assert sorted(asked_paths(hub, mark, 3)) == [  # the token, and each repo's access: nothing else
        "GET /api/whoami-v2", f"HEAD /{DRAFTER}/resolve/{hub.shas[DRAFTER]}/config.json",
        f"HEAD /{KIMI}/resolve/{hub.shas[KIMI]}/config.json"]


def test_the_cache_is_the_users_own_and_closed_to_others(hub, cache_home):
    take(hub.url, TOKEN_GRANTED, KIMI, hub.shas[KIMI])
    for directory in (cache_home / "specfleet", cache_home / "specfleet" / "hub"):
        assert directory.stat().st_mode & 0o777 == 0o700 and directory.stat().st_uid == os.geteuid()
    [entry] = entries(cache_home)
    assert entry.stat().st_mode & 0o777 == 0o600


def test_nothing_is_kept_inside_a_directory_another_user_can_write(hub, cache_home, monkeypatch):
    shared = cache_home / "shared"
    shared.mkdir()
    shared.chmod(0o1777)  # as /tmp
    monkeypatch.setenv("XDG_CACHE_HOME", str(shared / "cache"))
    assert hub_cache.directory() is None
    assert take(hub.url, TOKEN_GRANTED, KIMI, hub.shas[KIMI]).commit == hub.shas[KIMI]  # asked of the hub instead
    assert not (shared / "cache").exists()


def test_a_linked_cache_directory_is_not_used(hub, cache_home):
    elsewhere = cache_home / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    (cache_home / "specfleet" / "hub").rmdir()
    (cache_home / "specfleet" / "hub").symlink_to(elsewhere)
    assert hub_cache.directory() is None
    take(hub.url, TOKEN_GRANTED, KIMI, hub.shas[KIMI])
    assert list(elsewhere.iterdir()) == []


@pytest.mark.parametrize("repo_id", [KIMI, DRAFTER, QWEN, QWEN_RETRAINED])
def test_a_kept_snapshot_equals_the_clients_field_by_field(hub, cache_home, repo_id):
    from_client = ask_client(hub.url, TOKEN_GRANTED, repo_id, hub.shas[repo_id])
    assert take(hub.url, TOKEN_GRANTED, repo_id, hub.shas[repo_id]) == from_client  # asked, then kept
    mark = len(read_request_log(hub.state))
    from_cache = take(hub.url, TOKEN_GRANTED, repo_id, hub.shas[repo_id])
    assert asked_paths(hub, mark) == [f"HEAD /{repo_id}/resolve/{hub.shas[repo_id]}/config.json"]
    for field in fields(RepoSnapshot):
        assert getattr(from_cache, field.name) == getattr(from_client, field.name), field.name
    assert (from_cache.total_bytes, from_cache.weight_bytes, from_cache.text_config()) == (
        from_client.total_bytes, from_client.weight_bytes, from_client.text_config())


def test_a_revoked_token_is_refused_with_the_same_sentence_when_the_listing_is_kept(hub, cache_home, monkeypatch):
    weights = lab_weights(hub)
    for repo in weights.repos:
        take(hub.url, TOKEN_GRANTED, repo.repo_id, repo.revision)
    assert len(entries(cache_home)) == 2
    monkeypatch.setenv("HF_TOKEN", REVOKED)
    state = hub_state(weights)
    assert state.snapshots == {} and state.pending == [] and state.problems == [
        f"the Hugging Face token is invalid (401 from {hub.url}): create a read token at "
        "https://huggingface.co/settings/tokens and export HF_TOKEN"]
    with pytest.raises(hub_requests.HubOutage, match="401"):  # a kept listing is no access
        take(hub.url, REVOKED, KIMI, hub.shas[KIMI])


def test_a_gated_repo_not_granted_waits_for_its_terms_when_its_listing_is_kept(hub, cache_home, monkeypatch):
    take(hub.url, TOKEN_GRANTED, DRAFTER, hub.shas[DRAFTER])
    with pytest.raises(AccessPending) as from_client:
        ask_client(hub.url, TOKEN_DENIED, DRAFTER, hub.shas[DRAFTER])
    mark = len(read_request_log(hub.state))
    with pytest.raises(AccessPending) as from_cache:
        take(hub.url, TOKEN_DENIED, DRAFTER, hub.shas[DRAFTER])
    assert str(from_cache.value) == str(from_client.value) == (
        f"the token has no access to the gated repo {DRAFTER}: accept its terms at {hub.url}/{DRAFTER} (logged in "
        "as the token's user), then re-run")
    assert asked_paths(hub, mark) == [f"HEAD /{DRAFTER}/resolve/{hub.shas[DRAFTER]}/config.json"]

    take(hub.url, TOKEN_GRANTED, KIMI, hub.shas[KIMI])
    monkeypatch.setenv("HF_TOKEN", TOKEN_DENIED)
    state = hub_state(lab_weights(hub))
    assert list(state.snapshots) == ["target"] and state.problems == [] and state.pending == [str(from_client.value)]


def test_a_repo_or_commit_gone_from_the_hub_is_refused_as_the_client_refuses_it(hub, cache_home):
    """What the hub no longer has, though the controller kept it (the kept entries are copies of a real one)."""
    take(hub.url, TOKEN_GRANTED, KIMI, hub.shas[KIMI])
    answer = json.loads(entry_of(hub, KIMI).read_text())
    for repo_id, commit in (("lab/gone", hub.shas[KIMI]), (KIMI, "1" * 40)):
        hub_cache.write(hub.url, repo_id, commit, {**answer, "repo_id": repo_id, "commit": commit})
        assert kept(hub.url, repo_id, commit) is not None
        with pytest.raises(HubProblem) as from_client:
            ask_client(hub.url, TOKEN_GRANTED, repo_id, commit)
        with pytest.raises(HubProblem) as from_cache:
            take(hub.url, TOKEN_GRANTED, repo_id, commit)
        assert str(from_cache.value) == str(from_client.value)
        assert type(from_cache.value) is type(from_client.value) is HubProblem


TAMPERED = {
    "another commit": lambda answer: {**answer, "commit": "1" * 40},
    "a commit not 40 hex": lambda answer: {**answer, "commit": answer["commit"] + "\nExecStartPre=+/bin/true"},
    "a path with ..": lambda answer: {**answer, "files": answer["files"] + [
        {"path": "../escape.safetensors", "size": 1, "sha256": "0" * 64, "git_sha1": None}]},
    "a hash not hex": lambda answer: {**answer, "files": [{**f, "sha256": "zz" * 32} if f["sha256"] else f
                                                          for f in answer["files"]]},
    "another repo's": lambda answer: {**answer, "repo_id": DRAFTER},
    "another hub's": lambda answer: {**answer, "endpoint": "http://mirror.example"},
    "no config.json listed": lambda answer: {**answer, "files": [f for f in answer["files"]
                                                                 if f["path"] != "config.json"]},
    "a config that is no object": lambda answer: {**answer, "config": ["model_type"]},
    "files that are no list of entries": lambda answer: {**answer, "files": {"config.json": 1}},
}


@pytest.mark.parametrize("tamper", [*TAMPERED, "not JSON", "nested past the parser", "a link", "open to others"])
def test_a_tampered_cache_entry_is_not_trusted_but_asked_again(hub, cache_home, tamper):
    honest = take(hub.url, TOKEN_GRANTED, KIMI, hub.shas[KIMI])
    entry = entry_of(hub, KIMI)
    answer = json.loads(entry.read_text())
    if tamper == "not JSON":
        entry.write_text(entry.read_text()[:-10])
    elif tamper == "nested past the parser":
        entry.write_text("[" * 100_000 + "]" * 100_000)
    elif tamper == "a link":
        copy = cache_home / "copy.json"
        shutil.copy(entry, copy)
        entry.unlink()
        entry.symlink_to(copy)
    elif tamper == "open to others":
        entry.chmod(0o666)
    else:
        entry.write_text(json.dumps(TAMPERED[tamper](answer)))
    assert kept(hub.url, KIMI, hub.shas[KIMI]) is None
    mark = len(read_request_log(hub.state))
    assert take(hub.url, TOKEN_GRANTED, KIMI, hub.shas[KIMI]) == honest
    assert f"GET /api/models/{KIMI}/revision/{hub.shas[KIMI]}" in asked_paths(hub, mark)
    assert not entry.is_symlink() and json.loads(entry.read_text()) == answer  # kept anew, as the hub said it


def test_a_branch_revision_is_asked_of_the_hub_every_time(hub, cache_home):
    for _ in range(2):
        mark = len(read_request_log(hub.state))
        assert take(hub.url, TOKEN_GRANTED, KIMI, "main").commit == hub.shas[KIMI]
        assert f"GET /api/models/{KIMI}/revision/main" in asked_paths(hub, mark)
    assert entries(cache_home) == [] and kept(hub.url, KIMI, "main") is None


def test_a_redirect_is_the_answer_never_followed_with_the_token(hub):
    shard = "model-00001-of-00004.safetensors"  # an LFS file: the hub sends it to its CDN
    mark = len(read_request_log(hub.state))
    answer = hub_requests.asked("HEAD", f"{hub.url}/{KIMI}/resolve/{hub.shas[KIMI]}/{shard}", TOKEN_GRANTED)
    assert answer.status == 302 and answer.commit == hub.shas[KIMI]  # followed, the CDN would refuse the token: 400
    assert asked_paths(hub, mark) == [f"HEAD /{KIMI}/resolve/{hub.shas[KIMI]}/{shard}"]
    assert [r["server"] for r in new_log_entries(hub, mark)] == ["hub"]


@pytest.mark.parametrize("token", [REVOKED, TOKEN_DENIED, "hf_secret\nX-Injected: 1"])
def test_the_token_is_in_no_refusal_or_outage(hub, cache_home, token):
    take(hub.url, TOKEN_GRANTED, DRAFTER, hub.shas[DRAFTER])
    said = [token_problem(hub.url, token), token_problem("http://127.0.0.1:9", token)]  # nothing listens on 9
    for endpoint in (hub.url, "http://127.0.0.1:9"):
        hub_cache.write(endpoint, DRAFTER, hub.shas[DRAFTER], {
            **json.loads(entry_of(hub, DRAFTER).read_text()), "endpoint": endpoint})
        with pytest.raises((HubProblem, OSError)) as refused:
            take(endpoint, token, DRAFTER, hub.shas[DRAFTER])
        said += [str(refused.value), repr(refused.value), *map(str, (refused.value.__cause__,
                                                                     refused.value.__context__))]
    set_faults(hub.state, gone=True)
    said.append(token_problem(hub.url, token))
    assert len([text for text in said if text and text != "None"]) >= 5
    assert [text for text in said if token in text or "hf_secret" in text] == [], said


def test_a_plain_http_hf_endpoint_on_the_controller_is_refused_before_the_token_is_sent(monkeypatch):
    """HF_ENDPOINT is the hub the controller asks where hf_endpoint names none: it is held to hf_endpoint's
    https check, so the token never travels in clear to it (a listener on loopback records what reaches it)."""
    heard = []

    class Hub(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            heard.append((self.path, self.headers.get("Authorization")))
            body = b'{"name": "lab"}'
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_HEAD = do_GET

        def log_message(self, *args):
            pass

    with http.server.ThreadingHTTPServer(("127.0.0.1", 0), Hub) as server:
        threading.Thread(target=server.serve_forever, daemon=True).start()
        monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{server.server_port}")
        monkeypatch.setenv("HF_TOKEN", TOKEN_GRANTED)
        state = hub_state(resolve(host_data("b200_nvlink"), "b200_nvlink").weights)
        assert token_problem(None, TOKEN_GRANTED).startswith("the controller's HF_ENDPOINT='http://127.0.0.1:")
        server.shutdown()
    assert heard == [] and state.snapshots == {} and len(state.problems) == 1
    assert "HF_ENDPOINT" in state.problems[0] and "https://" in state.problems[0]
    monkeypatch.setenv("HF_ENDPOINT", "https://hub.example/mirror/")  # https: the controller's hub
    assert weights_hub.hub_url(None) == "https://hub.example/mirror"
