"""The HF token and the API key under --diff, verbose, debug and failing deploys: only ever in their files.
A deploy without the key keeps it; root's directories stay root's; the probe sends the key only to the server."""

import hashlib
import json
import shlex
import time

import pytest

from lab import fleet
from tests.faults.faultlab import record, secret_locations
from tests.helpers import SGLANG_UNIT, main_pid, run_deploy, write_group_data

pytestmark = pytest.mark.lab

TOKEN = "hf_lab_granted"
TOKEN_FILE = "/home/sglang-download/.cache/huggingface/token"  # the download user's; never the service user's
KEY_FILE = "/etc/specfleet/api-key"
CONFIG_DIR = "/etc/specfleet"
# Two lab keys (a rotation); the second starts with "-", which argparse would read as a flag.
KEYS = ("specfleet-lab-key-4f1d0c9a7b2e5d3c", "-specfleet-lab-key-rotated-9e8d7c6b")
LOUD = ("--diff", "-vvv", "--debug")


def drop_secret_files(hosts) -> None:
    """So the deploy uploads both again (an unchanged file is not uploaded, and so not tested)."""
    for host in hosts:
        fleet.ssh(host, f"rm -f {TOKEN_FILE} {KEY_FILE}")


def uploaded(hosts, *paths: str) -> None:
    for host in hosts:
        for path in paths:
            assert fleet.ssh(host, f"test -f {path} && echo yes", check=False).strip() == "yes", \
                f"{host.name}: the deploy did not upload {path}"


def status_of(host, path: str, key: str | None = None) -> int:
    """HTTP status of a GET on the server (the key, if any, from a file written on the host, never argv)."""
    header = ""
    if key is not None:
        fleet.ssh(host, f"umask 077; printf 'Authorization: Bearer %s' {json.dumps(key)} > /root/.probe-header")
        header = "-H @/root/.probe-header"
    return int(fleet.ssh(host, f"curl -s -o /dev/null -m 10 {header} -w '%{{http_code}}' localhost:30000{path}; "
                               "rm -f /root/.probe-header", check=False) or 0)


def printed_nowhere(run) -> None:
    assert "Hugging Face token" in run.output and "API key" in run.output  # both operations ran
    for secret in (TOKEN, *KEYS):
        assert secret not in run.output, f"a secret ({secret[:6]}...) is in the deploy's output"
        # Nor a plain digest of it, which a log's reader could check guesses against offline.
        for digest in (hashlib.sha1(secret.encode()).hexdigest(), hashlib.sha256(secret.encode()).hexdigest()):
            assert digest not in run.output, f"a plain digest of a secret ({secret[:6]}...) is in the deploy's output"


@pytest.fixture
def api_key_removed_after(lab_hosts, monkeypatch):
    """Every test here leaves the lab as it found it: no API key (the other tests call the server without one)."""
    yield
    monkeypatch.delenv("SPECFLEET_API_KEY", raising=False)
    cleared = run_deploy("--data", "remove_api_key=true")
    assert cleared.returncode == 0, cleared.output[-3000:]


def test_secrets_only_in_their_files_after_diff_verbose_debug_failing_and_rotating_deploys(
        deployed_lab, lab_hosts, tmp_path, monkeypatch, api_key_removed_after):
    # A step after the uploads fails on every host: SGLang rejects a flag.
    failing = write_group_data(tmp_path, "all", (
        "profiles = copy.deepcopy(base['profiles'])\n"
        "profiles['kimi_k26_dflash']['server_args'] = [*profiles['kimi_k26_dflash']['server_args'], "
        "'--reasoning-parser', 'no-such-parser']"))
    monkeypatch.setenv("SPECFLEET_API_KEY", KEYS[0])
    drop_secret_files(lab_hosts)
    failed = run_deploy(*LOUD, group_data=failing)
    printed_nowhere(failed)
    assert failed.returncode != 0 and "rejects the rendered flags" in failed.output, failed.output[-3000:]
    uploaded(lab_hosts, TOKEN_FILE, KEY_FILE)
    drop_secret_files(lab_hosts)
    first = run_deploy(*LOUD)  # first upload of both
    printed_nowhere(first)
    assert first.returncode == 0, first.output[-3000:]
    uploaded(lab_hosts, TOKEN_FILE, KEY_FILE)
    monkeypatch.setenv("SPECFLEET_API_KEY", KEYS[1])
    rotated = run_deploy(*LOUD)  # the key file exists and changes
    printed_nowhere(rotated)
    assert rotated.returncode == 0, rotated.output[-3000:]
    runs = (failed, first, rotated)
    for host in lab_hosts:
        assert fleet.ssh(host, f"stat -c '%a %U %G' {TOKEN_FILE}").split() == \
            ["600", "sglang-download", "sglang-download"]
        assert fleet.ssh(host, f"stat -c '%a' {TOKEN_FILE.rsplit('/', 1)[0]}").strip() == "700"
        # The service user runs the model's code: it cannot read the token.
        assert fleet.ssh(host, f"runuser -u sglang -- cat {TOKEN_FILE} >/dev/null 2>&1; echo rc=$?").strip() != "rc=0"
        assert fleet.ssh(host, f"stat -c '%a %U %G' {KEY_FILE}").split() == ["640", "root", "sglang"]
        # Not in any unit or environment file, process argv or environment, log file or journal line.
        assert secret_locations(host, TOKEN) == [TOKEN_FILE]
        assert secret_locations(host, KEYS[1]) == [KEY_FILE]
        assert secret_locations(host, KEYS[0]) == []
        # The rotated key (leading "-" included) is the one the server requires.
        assert status_of(host, "/v1/models") == 401
        assert status_of(host, "/v1/models", KEYS[0]) == 401
        assert status_of(host, "/v1/models", KEYS[1]) == 200
    record("secrets secrecy", result="only in their files", runs="--diff -vvv --debug: failing, first upload, "
           "key rotation", output_bytes_checked=sum(len(run.output) for run in runs))


def test_a_deploy_without_the_key_keeps_it_and_root_directories_stay_roots(
        deployed_lab, lab_hosts, monkeypatch, api_key_removed_after):
    host = lab_hosts[0]
    monkeypatch.setenv("SPECFLEET_API_KEY", KEYS[0])
    keyed = run_deploy("--limit", host.name)
    assert keyed.returncode == 0, keyed.output[-3000:]
    # The service user can plant nothing where root writes: no link in the config or install directories.
    for directory in (CONFIG_DIR, "/opt/specfleet", "/opt/specfleet/bin"):
        planted = fleet.ssh(host, f"runuser -u sglang -- ln -s /etc/passwd {directory}/.planted 2>&1; "
                                  f"test -L {directory}/.planted && echo planted; rm -f {directory}/.planted",
                            check=False)
        assert "planted" not in planted.splitlines(), f"{host.name}: the service user can write in {directory}"
    assert fleet.ssh(host, f"stat -c '%U %a' {CONFIG_DIR}").split() == ["root", "755"]
    assert fleet.ssh(host, "stat -c %U /home/sglang/.cache").strip() == "sglang"

    pid = main_pid(host)
    monkeypatch.delenv("SPECFLEET_API_KEY")
    keyless = run_deploy("--limit", host.name)
    assert keyless.returncode == 0, keyless.output[-3000:]
    assert fleet.ssh(host, f"test -f {KEY_FILE} && echo kept", check=False).strip() == "kept"
    assert main_pid(host) == pid, "the server was restarted"
    assert status_of(host, "/v1/models") == 401, "the server runs open"

    removed = run_deploy("--limit", host.name, "--data", "remove_api_key=true")
    assert removed.returncode == 0, removed.output[-3000:]
    assert fleet.ssh(host, f"test -f {KEY_FILE} || echo gone", check=False).strip() == "gone"
    assert main_pid(host) != pid and status_of(host, "/v1/models") == 200
    record("deploy without the key", result="key kept, server not restarted, closed; removed only on request")


# A listener another local user (nobody) starts on the server's port while the server is down:
# it records the headers of whatever it is sent.
_IMPOSTOR = r"""
import http.server, json, os, sys
open(sys.argv[3], "w").write(str(os.getpid()))
class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        with open(sys.argv[2], "a") as log:
            log.write(json.dumps(dict(self.headers)) + "\n")
        self.send_response(200); self.send_header("Content-Length", "2"); self.end_headers(); self.wfile.write(b"{}")
    do_POST = do_GET
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
"""


def test_the_probe_sends_the_key_only_to_the_service(deployed_lab, pcie_host, api_key_removed_after):
    host, key = pcie_host, KEYS[0]
    heard, pid_file = "/tmp/specfleet-impostor.log", "/tmp/specfleet-impostor.pid"
    fleet.ssh(host, f"umask 027; printf %s {json.dumps(key)} > {KEY_FILE}; chgrp sglang {KEY_FILE}")
    fleet.ssh(host, f"systemctl stop {SGLANG_UNIT}")
    try:
        fleet.ssh(host, f"rm -f {heard} {pid_file}; touch {heard} {pid_file}; chown nobody {heard} {pid_file}; "
                        f"setsid runuser -u nobody -- python3 -c {shlex.quote(_IMPOSTOR)} 30000 {heard} {pid_file} "
                        "</dev/null >/dev/null 2>&1 &")
        time.sleep(1.5)
        probe = json.loads(fleet.ssh(host, f"python3 /opt/specfleet/bin/probe_server.py 30000 kimi-k2.6 "
                                           f"{KEY_FILE} sglang").splitlines()[-1])
        headers = fleet.ssh(host, f"cat {heard}", check=False)
    finally:
        fleet.ssh(host, f"kill $(cat {pid_file}); true", check=False)
        fleet.ssh(host, f"rm -f {KEY_FILE} {heard} {pid_file}; systemctl start {SGLANG_UNIT}")
    assert key not in headers, "the probe sent the API key to another user's listener"
    assert not probe.get("ready") and "the API key was not sent" in probe.get("error", ""), probe
    record("probe on an impostor's port", result="key not sent", probe_error=probe.get("error"))
