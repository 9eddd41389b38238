"""Preflight rules that are pure: exposure without a key, moving revisions and builds, hub outages."""

import http.server
import threading
from dataclasses import replace

import pytest
from pyinfra.context import ctx_host

from deployment.hosts import resolve, resolve_worker
from deployment.server.config import git_refs, pinned_requirement
from operations.basics import shell
from operations.gpu import nvidia
from operations.gpu.packages import NvidiaPackages
from operations.run import preflight
from operations.run.preflight import LoginUser, login_problems, moving_revisions
from operations.server.checks import exposure_problems, unpinned_build
from operations.weights.checks import HubState, described, hub_state, unpinned
from operations.weights.hub import RepoSnapshot
from lab.config import TOKEN_DENIED, TOKEN_GRANTED
from tests.unit.fakehost import FakeHost, failure
from tests.unit.group_data import host_data

COMMIT = "0123456789abcdef0123456789abcdef01234567"


class NamedHost:
    name = "gpu-host"


def deployment(**data):
    return resolve(host_data("b200_nvlink", **data), "b200_nvlink")


def found(hub: HubState) -> tuple:
    return hub.snapshots, hub.problems, hub.pending


def exposure(d, key_on_controller=False, key_on_host=False):
    with ctx_host.use(NamedHost()):
        return exposure_problems(d.host.service, key_on_controller, key_on_host)


def test_a_server_beyond_loopback_needs_a_key_and_the_refusal_names_both_ways_out():
    assert deployment().host.service.bind_address == "127.0.0.1" and exposure(deployment()) == []
    wide = deployment(bind_address="0.0.0.0")
    [problem] = exposure(wide)
    assert problem == ("gpu-host: the servers would listen on 0.0.0.0, beyond loopback, without an API key "
                       "($SPECFLEET_API_KEY is not set on the controller and the host has no key): export "
                       "SPECFLEET_API_KEY on the controller (the servers then require it), or set "
                       "bind_address=127.0.0.1 and reach them through a gateway on the host")
    assert exposure(wide, key_on_controller=True) == []
    assert exposure(wide, key_on_host=True) == []  # the host's key stays: only remove_api_key removes it


def test_the_exposure_is_the_hosts_whichever_deployment_comes_first():
    """Every server of a host listens on its one bind_address: the refusal says the host's, no replica's port."""
    data = host_data("b200_nvlink", bind_address="0.0.0.0", deployments=[
        dict(profile="qwen36_ddtree", gpus=[0, 1], name="a"), dict(profile="qwen36_ddtree", gpus=[2, 3], name="b",
                                                                  port=30100)])
    worker, found = resolve_worker(data, "b200_nvlink")
    with ctx_host.use(NamedHost()):
        [problem] = exposure_problems(worker.service, False, False)
    assert problem.startswith("gpu-host: the servers would listen on 0.0.0.0, beyond loopback, without an API key ")
    assert not any(str(r.port) in problem for d in found for r in d.replicas)


def test_removing_the_key_is_refused_while_the_server_is_reachable_beyond_loopback():
    assert "remove_api_key is set" in exposure(deployment(bind_address="10.0.0.5", remove_api_key="yes"),
                                               key_on_controller=True, key_on_host=True)[0]
    assert exposure(deployment(remove_api_key=True)) == []  # loopback: no key needed
    assert exposure(deployment(bind_address="::1")) == []


def test_branch_revisions_name_the_commit_to_pin():
    snapshots = {role: RepoSnapshot(f"r/{role}", COMMIT, (), {}) for role in ("target", "drafter")}
    [target, drafter] = unpinned(deployment().weights, snapshots, "kimi_k26_dflash")
    assert target == (f"moonshotai/Kimi-K2.6: revision 'main' is not a commit; it resolves to {COMMIT} now: pin "
                      "it with `python pin.py INVENTORY` (it writes the commits of profile kimi_k26_dflash to "
                      "SPECFLEET_SITE/pins.json) for reproducible weights, or set allow_branch_revisions=true to "
                      "follow the branch")
    assert unpinned(resolve(host_data("b200_nvlink", lab=True), "b200_nvlink").weights, snapshots, "x") == []


def test_a_git_build_must_name_a_commit_not_a_pull_request_ref():
    ddtree = deployment(profile="qwen36_ddtree")
    [problem] = unpinned_build(ddtree.engine)
    assert "'refs/pull/29907/head' is not a commit" in problem and "python pin.py INVENTORY" in problem
    assert "git ls-remote https://github.com/sgl-project/sglang refs/pull/29907/head" in problem
    pinned = replace(ddtree.engine, sglang_requirement=f"sglang @ git+https://github.com/sgl-project/sglang@{COMMIT}"
                                                  "#subdirectory=python")
    assert unpinned_build(pinned) == []
    assert unpinned_build(deployment().engine) == []  # a release pin has no git ref


def test_moving_revisions_fail_the_host_unless_allow_branch_revisions_makes_them_warnings():
    snapshots = {role: RepoSnapshot(f"r/{role}", COMMIT, (), {}) for role in ("target", "drafter")}
    hub = HubState(snapshots, [], [])
    problems, warnings = moving_revisions(deployment(profile="qwen36_ddtree"), hub)
    assert len(problems) == 3 and warnings == []  # both repos at 'main', and the pull-request ref
    allowed = deployment(profile="qwen36_ddtree", allow_branch_revisions="yes")
    assert moving_revisions(allowed, hub) == ([], problems)
    assert moving_revisions(resolve(host_data("b200_nvlink", lab=True), "b200_nvlink"), hub) == ([], [])


def test_pins_turn_moving_revisions_and_refs_into_their_commits_and_nothing_else():
    ref = "https://github.com/sgl-project/sglang@refs/pull/29907/head"
    pins = {"repos": {"moonshotai/Kimi-K2.6@main": COMMIT, "Qwen/Qwen3.6-27B@main": "1" * 40}, "git": {ref: "2" * 40}}
    kimi = deployment(pins=pins)
    assert [r.revision for r in kimi.weights.repos] == [COMMIT, "main"]  # the drafter has no pin yet
    qwen = deployment(profile="qwen36_ddtree", pins=pins)
    assert qwen.weights.target.revision == "1" * 40
    assert qwen.engine.sglang_requirement == (f"sglang @ git+https://github.com/sgl-project/sglang@{'2' * 40}"
                                              "#subdirectory=python")
    assert unpinned_build(qwen.engine) == []
    # A pin is keyed by what is fetched: a mirror's repo and revision (the lab pins by commit already).
    assert resolve(host_data("b200_nvlink", lab=True, pins=pins), "b200_nvlink").weights.target.revision == \
        "cab62ee5866130af4b3f1e1a6a83cf419015a31f"
    with pytest.raises(ValueError, match="pins repos moonshotai/Kimi-K2.6@main='main; rm -rf /' is not accepted"):
        deployment(pins={"repos": {"moonshotai/Kimi-K2.6@main": "main; rm -rf /"}})


@pytest.mark.parametrize("requirement, refs", [
    ("sglang @ git+ssh://git@git.example.org/sgl/sglang.git@v0.5.23#subdirectory=python",
     [("ssh://git@git.example.org/sgl/sglang.git", "v0.5.23")]),
    ("sglang @ git+git@git.example.org:sgl/sglang.git@refs/pull/7/head",
     [("git@git.example.org:sgl/sglang.git", "refs/pull/7/head")]),
    ("sglang @ git+https://github.com/sgl-project/sglang@main#subdirectory=python",
     [("https://github.com/sgl-project/sglang", "main")]),
    ("sglang @ git+ssh://git@git.example.org/sgl/sglang.git#subdirectory=python", []),  # no ref: the user's @ only
    ("sglang @ git+git@git.example.org:sgl/sglang.git", []),
])
def test_a_git_requirements_ref_is_what_follows_the_last_at_past_its_host(requirement, refs):
    assert git_refs(requirement) == refs
    pins = {"git": {f"{url}@{ref}": "2" * 40 for url, ref in refs}}
    assert git_refs(pinned_requirement(requirement, pins)) == [(url, "2" * 40) for url, _ in refs]


def test_a_hubs_config_strings_print_with_their_control_characters_escaped():
    config = {"model_type": "kimi\x1b]0;owned\x07", "num_hidden_layers": "61\r\n\u202e"}
    said = described(deployment().weights, {"target": RepoSnapshot("r/target", COMMIT, (), config)})
    assert said.startswith("moonshotai/Kimi-K2.6@0123456789ab (kimi\\x1b]0;owned\\x07, 61\\r\\n\\u202e layers")
    assert said.isprintable()


@pytest.mark.parametrize("login, problem", [
    ({"user": "root", "login": "root", "sudo": False}, None),
    ({"user": "root", "login": "deployer", "sudo": True}, None),
    ({"user": "deployer", "login": "deployer", "sudo": False},
     "gpu-host: the deploy logged in as deployer, not root: add --sudo to the pyinfra command (with "
     "passwordless sudo for that user), or log in as root"),
    ({"user": "sglang", "login": "deployer", "sudo": True},
     "gpu-host: the deploy runs as sglang through sudo, but it must run as root: drop --sudo-user"),
], ids=["root", "sudo", "plain user", "sudo to another user"])
def test_the_deploy_acts_as_root_through_a_root_login_or_sudo(login, problem):
    with ctx_host.use(NamedHost()):
        assert login_problems(login) == ([problem] if problem else [])
    assert LoginUser().process(["root deployer"]) == {"user": "root", "login": "deployer", "sudo": True}
    assert LoginUser().process(["deployer "]) == {"user": "deployer", "login": "deployer", "sudo": False}


def test_a_sudo_password_is_refused_before_any_command_would_carry_it():
    """pyinfra 3.10 hands sudo its password on each escalated command line (operations/basics/shell.py)."""
    refusal = ("gpu-host: sudo takes a password from deployer, which pyinfra puts on every command line it runs "
               "through sudo (readable by every local user): give deployer passwordless sudo (a line 'deployer "
               "ALL=(ALL) NOPASSWD: ALL' in /etc/sudoers.d/), then re-run without a sudo password")
    with ctx_host.use(NamedHost()):
        assert login_problems({"user": "root", "login": "deployer", "sudo": True}, password=True) == [refusal]
    for arguments, connector_data in (({"_sudo": True, "_sudo_password": "pw"}, {}),
                                      ({"_sudo": True}, {"prompted_sudo_password": "pw"})):
        host = FakeHost({}, arguments)
        host.connector_data.update(connector_data)
        assert shell.sudo_password(host)
    assert not shell.sudo_password(FakeHost({}, {"_sudo": True}))
    d = deployment(lab=True)
    host = FakeHost({}, {"_sudo": True, "_sudo_password": "pw"})
    host.data = {"ssh_user": "deployer"}
    with ctx_host.use(host):
        [command] = list(preflight.check._inner(worker=d.host, deployments=(d,), hubs=[HubState({}, [], [])]))
    assert failure([command]) == [refusal.replace("gpu-host", "host-1")]  # no fact was read: nothing ran


class Failing(http.server.BaseHTTPRequestHandler):
    """Accepts the token, then answers 503 to everything else (a hub whose storage is down)."""

    def do_GET(self):
        body = b'{"type": "user", "name": "unit"}' if self.path.startswith("/api/whoami-v2") else b""
        self.send_response(200 if body else 503)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def broken_hub():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Failing)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_a_hub_outage_or_5xx_is_a_sentence_not_a_traceback(broken_hub, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_unit")
    broken = deployment(hf_endpoint=broken_hub, allow_http_hub=True)
    snapshots, problems, access_pending = found(hub_state(broken.weights))
    assert snapshots == {} and access_pending == [] and [p.split(" (")[0] for p in problems] == [
        f"the hub at {broken_hub}/moonshotai/Kimi-K2.6 did not answer as a hub does",
        f"the hub at {broken_hub}/z-lab/Kimi-K2.6-DFlash did not answer as a hub does"]
    assert "503" in problems[0] and problems[0].endswith("then re-run (nothing was changed)")
    nobody = deployment(hf_endpoint="http://127.0.0.1:9", allow_http_hub=True)  # nothing listens
    snapshots, [problem], _ = found(hub_state(nobody.weights))
    assert problem.startswith("the hub at http://127.0.0.1:9 did not answer as a hub does (ConnectionRefusedError")


class MeetingHub(Failing):
    """Answers a repo's model info 500 only if the other repo's request arrives while it waits (the
    repos are asked at once), else 503 after a bounded wait (asked one after the other)."""
    barrier: threading.Barrier

    def do_GET(self):
        if not self.path.startswith("/api/models/"):
            return super().do_GET()
        try:
            self.barrier.wait()
            self.send_response(500)
        except threading.BrokenBarrierError:
            self.send_response(503)
        self.send_header("Content-Length", "0")
        self.end_headers()


def test_the_repos_hub_snapshots_are_taken_at_once(monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_unit")
    monkeypatch.setattr(MeetingHub, "barrier", threading.Barrier(2, timeout=3), raising=False)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), MeetingHub)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        meeting = deployment(hf_endpoint=f"http://127.0.0.1:{server.server_address[1]}", allow_http_hub=True)
        problems = hub_state(meeting.weights).problems
    finally:
        server.shutdown()
    assert len(problems) == 2 and all("500" in problem for problem in problems), problems


class TokenMeetingHub(Failing):
    """Knows the token only if both repos' model infos are asked while its whoami waits (the token and the repos
    are asked at once), else answers the whoami 503 after a bounded wait (asked one after the other)."""
    barrier: threading.Barrier

    def do_GET(self):
        if self.path.startswith(("/api/whoami-v2", "/api/models/")):
            try:
                self.barrier.wait()
            except threading.BrokenBarrierError:
                self.send_response(503)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
        super().do_GET()


def test_the_token_is_checked_at_once_with_the_repos_snapshots(monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_unit")
    monkeypatch.setattr(TokenMeetingHub, "barrier", threading.Barrier(3, timeout=3), raising=False)  # whoami, 2 repos
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), TokenMeetingHub)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        problems = hub_state(deployment(hf_endpoint=url, allow_http_hub=True).weights).problems
    finally:
        server.shutdown()
    # The token known, each repo's outage is its own sentence; asked one after the other, the token's check fails.
    assert [p.split(" (")[0] for p in problems] == [
        f"the hub at {url}/moonshotai/Kimi-K2.6 did not answer as a hub does",
        f"the hub at {url}/z-lab/Kimi-K2.6-DFlash did not answer as a hub does"]


def test_without_a_token_no_repo_is_asked(broken_hub, monkeypatch):
    monkeypatch.setattr("operations.weights.checks.controller_token", lambda env_name: None)  # nor a token file
    asked = []
    monkeypatch.setattr("operations.weights.checks.repo_snapshot", lambda *args: asked.append(args))
    [problem] = hub_state(deployment(hf_endpoint=broken_hub, allow_http_hub=True).weights).problems
    assert problem.startswith("no Hugging Face token on the controller") and asked == []


def test_a_gated_repo_without_access_is_pending_apart_from_the_problems_and_the_others_are_read(
        hub, monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))  # the user's own cache stays out of it
    lab = resolve(host_data("b200_nvlink", lab=True, hf_endpoint=hub.url), "b200_nvlink").weights
    monkeypatch.setenv("HF_TOKEN", TOKEN_DENIED)
    snapshots, problems, [pending] = found(hub_state(lab))
    assert list(snapshots) == ["target"] and problems == []
    assert pending == ("the token has no access to the gated repo lab/Kimi-K2.6-DFlash-tiny: accept its terms at "
                       f"{hub.url}/lab/Kimi-K2.6-DFlash-tiny (logged in as the token's user), then re-run")
    monkeypatch.setenv("HF_TOKEN", TOKEN_GRANTED)
    snapshots, problems, access_pending = found(hub_state(lab))
    assert list(snapshots) == ["target", "drafter"] and problems == access_pending == []
    monkeypatch.setenv("HF_TOKEN", "hf_lab_unknown")  # a bad token is a problem for every host, never pending
    assert [len(found) for found in found(hub_state(lab))] == [0, 1, 0]


class DriverHost(NamedHost):
    def __init__(self, driver):
        self.driver, self.noops = driver, []

    def get_fact(self, fact, **kwargs):
        return NvidiaPackages.default() if fact is NvidiaPackages else self.driver

    def noop(self, text):
        self.noops.append(text)


def test_driver_branch_given_as_a_number_keeps_the_loaded_580_driver():
    """`--data driver_branch=580` arrives as an int; the deploy must not reinstall 580 on every run."""
    d = deployment(install_driver="yes", driver_branch=580)
    loaded = dict(version="580.95.05", kernel_module_version="580.95.05", open_kernel_module=True, cuda_version="13.0")
    with ctx_host.use(DriverHost(loaded)):
        assert list(nvidia.open_driver._inner(branch=d.host.gpu.driver_branch, install=d.host.gpu.install_driver)) == []
