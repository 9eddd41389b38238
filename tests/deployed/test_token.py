"""The Hugging Face token is a 0600 file of the service user's, and nowhere else on the host.

The token is taken the way the deploy takes it (operations.hub.controller_token) and only
ever travels to the host over the SSH channel's stdin: it is in no command line, and no
assertion message prints it ("the HF token" stands for it).
"""

import shlex

import pytest

# Reads the token from stdin; reports (never prints) whether the token file holds it and
# which places contain it: the unit, its environment file, the weights units, `ps`, the
# service's process environment, and the journals of the service and weights units.
_LEAK_SCRIPT = r"""
import json, os, subprocess, sys
token = sys.stdin.buffer.read()
token_file, unit_file, env_file, service, main_pid, *weights_units = sys.argv[1:]
found = []
def scan_file(label, path):
    try:
        if token in open(path, "rb").read():
            found.append(label)
    except OSError:
        pass
def scan_command(label, argv):
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    if any(token in line for line in process.stdout):
        found.append(label)
    process.wait()
try:
    matches = open(token_file, "rb").read() == token
except OSError:
    matches = None
scan_file(f"the unit file {unit_file}", unit_file)
scan_file(f"the environment file {env_file}", env_file)
for unit in weights_units:
    scan_file(f"the unit file /etc/systemd/system/{unit}.service", f"/etc/systemd/system/{unit}.service")
scan_command("`ps -eo args` output", ["ps", "-eww", "-o", "args"])
if main_pid not in ("", "0"):
    scan_file(f"the environment of {service}'s process {main_pid}", f"/proc/{main_pid}/environ")
for unit in [service, *weights_units]:
    scan_command(f"the journal of {unit}", ["journalctl", "-u", unit, "--no-pager", "-o", "cat"])
print(json.dumps({"token_file_matches": matches, "found_in": found}))
"""


def token_path(target) -> str:
    return f"{target.deployment.server.hf_home}/token"


def expected_token(target) -> str:
    token = target.hf_token()
    if not token:
        pytest.fail(f"{target.name}: expected the controller to hold the HF token the deploy used "
                    f"(${target.deployment.weights.hf_token_env} or huggingface_hub's token file), found none")
    return token


def leak_scan(target) -> dict:
    d = target.deployment.server

    def scan():
        main_pid = target.run(f"systemctl show -p MainPID --value {shlex.quote(d.service_name)}").stdout.strip()
        return target.python(_LEAK_SCRIPT, token_path(target), d.unit_file, d.env_file, d.service_name,
                             main_pid, *(repo.unit_name for repo in target.deployment.weights.repos),
                             stdin=expected_token(target).encode())
    return target.memo("token-leaks", scan)


def test_token_file_is_owned_by_the_service_user_mode_0600(target):
    d, path = target.deployment.server, token_path(target)
    stat = target.run(f"stat -c '%F|%U|%a' {shlex.quote(path)}")
    assert stat.rc == 0, f"{target.name}: expected the HF token file {path}, found none ({stat.stderr.strip()})"
    kind, owner, mode = stat.stdout.strip().split("|")
    assert kind == "regular file", f"{target.name}: expected {path} to be a regular file, found a {kind}"
    assert owner == d.service_user, f"{target.name}: expected {path} owned by {d.service_user}, found {owner}"
    assert int(mode, 8) == 0o600, f"{target.name}: expected {path} mode 0600, found mode {int(mode, 8):04o}"


def test_token_file_holds_the_controllers_token(target):
    matches = leak_scan(target)["token_file_matches"]
    assert matches, (f"{target.name}: expected {token_path(target)} to hold the HF token the controller "
                     f"deployed, found {'another token' if matches is False else 'no readable file'}")


def test_token_appears_nowhere_but_its_file(target):
    found = leak_scan(target)["found_in"]
    assert not found, f"{target.name}: expected the HF token only in {token_path(target)}, found it in " + \
        "; ".join(found)
