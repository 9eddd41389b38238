"""The Hugging Face token is a 0600 file of the download user's, and nowhere else on the host: the service user,
which runs the model's code, cannot read it, and reads the weights without writing them.

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
    return f"{target.deployment.host.service.hf_home}/token"


def expected_token(target) -> str:
    token = target.hf_token()
    if not token:
        pytest.fail(f"{target.name}: expected the controller to hold the HF token the deploy used "
                    f"(${target.deployment.weights.hf_token_env} or huggingface_hub's token file), found none")
    return token


def leak_scan(target) -> dict:
    d = target.deployment.replicas[0]

    def scan():
        main_pid = target.run(f"systemctl show -p MainPID --value {shlex.quote(d.service_name)}").stdout.strip()
        return target.python(_LEAK_SCRIPT, token_path(target), d.unit_file, d.env_file, d.service_name,
                             main_pid, *(repo.unit_name for repo in target.deployment.weights.repos),
                             stdin=expected_token(target).encode())
    return target.memo("token-leaks", scan)


def test_token_file_is_owned_by_the_download_user_mode_0600(target):
    d, path = target.deployment.replicas[0], token_path(target)
    stat = target.run(f"stat -c '%F|%U|%a' {shlex.quote(path)}")
    assert stat.rc == 0, f"{target.name}: expected the HF token file {path}, found none ({stat.stderr.strip()})"
    kind, owner, mode = stat.stdout.strip().split("|")
    assert kind == "regular file", f"{target.name}: expected {path} to be a regular file, found a {kind}"
    assert owner == d.engine.service.download_user, f"{target.name}: expected {path} owned by {d.engine.service.download_user}, found {owner}"
    assert int(mode, 8) == 0o600, f"{target.name}: expected {path} mode 0600, found mode {int(mode, 8):04o}"


def test_the_service_user_cannot_read_the_token(target):
    """Nor any deployment's own user (on a host of several): each runs a model's code."""
    d, path = target.deployment.replicas[0], token_path(target)
    for user in dict.fromkeys([d.engine.service.service_user, *(dep.engine.user for dep in target.deployments)]):
        read = target.run(f"runuser -u {shlex.quote(user)} -- cat {shlex.quote(path)} > /dev/null")
        assert read.rc != 0, f"{target.name}: expected {user} (the model's code) unable to read {path}, it read it"
    earlier = target.run(f"test -e {shlex.quote(d.engine.service.earlier_token_file)}")
    assert earlier.rc != 0, f"{target.name}: expected no token left at {d.engine.service.earlier_token_file}, found a file there"


def test_the_service_user_reads_the_weights_and_writes_none_of_them(target):
    """Each deployment's user (the service user, or its own in the service group) reads its weights."""
    for e in (dep.engine for dep in target.deployments):
        for directory in filter(None, (e.model_dir, e.draft_model_dir)):  # no drafter: its target alone
            config = shlex.quote(f"{directory}/config.json")
            probe = (f"test -r {config} && echo readable; test -w {config} && echo writable; "
                     f"test -w {shlex.quote(directory)} && echo writable-dir")
            found = target.run(f"runuser -u {shlex.quote(e.user)} -- sh -c {shlex.quote(probe)}").stdout.split()
            assert found == ["readable"], (f"{target.name}: expected {e.user} to read {directory}/config.json "
                                           f"and write nothing there, found {found or ['unreadable']}")


def test_token_file_holds_the_controllers_token(target):
    matches = leak_scan(target)["token_file_matches"]
    assert matches, (f"{target.name}: expected {token_path(target)} to hold the HF token the controller "
                     f"deployed, found {'another token' if matches is False else 'no readable file'}")


def test_token_appears_nowhere_but_its_file(target):
    found = leak_scan(target)["found_in"]
    assert not found, f"{target.name}: expected the HF token only in {token_path(target)}, found it in " + \
        "; ".join(found)
