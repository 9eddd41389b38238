"""The secrets (operations.weights.hf_token, operations.server.api_key, operations.basics.secret_files): facts in, commands out. A secret travels only on a command's stdin."""

import pytest
from pyinfra.api import StringCommand
from pyinfra.context import ctx_host

from deployment.hosts import resolve
from operations.basics import secret_files
from operations.basics.file_states import UserFileStates
from operations.basics.file_states import FileStates, digest_of
from operations.server import api_key
from operations.weights import hf_token
from tests.unit.fakehost import FakeHost, failure, run
from tests.unit.group_data import host_data

D = resolve(host_data("rtx_pro_6000_pcie"), "rtx_pro_6000_pcie").replicas[0]
SERVICE = D.engine.service  # what every server of the host shares
H = resolve(host_data("rtx_pro_6000_pcie"), "rtx_pro_6000_pcie").host
REMOVING = resolve(host_data("rtx_pro_6000_pcie", remove_api_key="true"), "rtx_pro_6000_pcie").replicas[0]
TOKEN_FILE = f"{SERVICE.hf_home}/token"
KEY = "0123456789abcdef0123456789abcdef"


def file(mode: str, user: str, group: str, content: str | None = None) -> dict:
    return dict(kind="file", mode=mode, user=user, group=group, digest=digest_of(content.encode()) if content else None)


def yielded(operation, facts, **kwargs) -> list:
    """The raw commands (StringCommand objects, with their connector arguments)."""
    with ctx_host.use(FakeHost(facts)):
        return list(operation._inner(**kwargs))


def test_token_in_place_is_a_noop(monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_secret")
    states = {SERVICE.hf_home: dict(kind="directory", mode="700", user="sglang-download", group="sglang-download", digest=None),
              TOKEN_FILE: file("600", "sglang-download", "sglang-download", "hf_secret")}
    commands, noops = run(hf_token.hf_token, {UserFileStates: states}, token_env=H.hf_token_env, service=H.service)
    assert commands == [] and noops == [f"{TOKEN_FILE} holds the token (0600, sglang-download)"]


def test_token_is_written_by_the_download_user_from_stdin_out_of_the_service_users_home(monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_secret")
    [command] = yielded(hf_token.hf_token, {UserFileStates: {SERVICE.hf_home: None, TOKEN_FILE: None}}, token_env=H.hf_token_env, service=H.service)
    assert isinstance(command, StringCommand) and command.connector_arguments == {"_stdin": "hf_secret"}
    text = command.get_raw_value()
    assert "hf_secret" not in text
    assert text.startswith("runuser -u sglang-download -- sh -c ") and "umask 077" in text and "mktemp" in text
    assert text.endswith(f"secret {SERVICE.hf_home} token 600 sglang-download")
    assert SERVICE.hf_home == "/home/sglang-download/.cache/huggingface" and not SERVICE.hf_home.startswith(SERVICE.service_home + "/")


def test_the_token_a_deployment_without_a_download_user_kept_is_removed_by_the_service_user(monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_secret")
    states = {SERVICE.hf_home: dict(kind="directory", mode="700", user="sglang-download", group="sglang-download", sha1=None),
              TOKEN_FILE: file("600", "sglang-download", "sglang-download", "hf_secret"),
              "/home/sglang/.cache/huggingface/token": file("600", "sglang", "sglang", "hf_secret")}
    commands, noops = run(hf_token.hf_token, {UserFileStates: states}, token_env=H.hf_token_env, service=H.service)
    assert commands == ["runuser -u sglang -- rm -f -- /home/sglang/.cache/huggingface/token"]
    assert noops == [f"{TOKEN_FILE} holds the token (0600, sglang-download)"]


def test_user_file_states_reads_as_the_user_and_reads_missing_without_one():
    command = UserFileStates().command(user="sglang", paths=("/home/sglang/.cache/huggingface/token",))
    assert command.startswith("if id -u sglang >/dev/null 2>&1; then runuser -u sglang -- sh -c ")
    assert command.endswith("else echo '/home/sglang/.cache/huggingface/token|missing'; fi")


def test_no_key_on_the_controller_keeps_the_hosts_key(monkeypatch):
    monkeypatch.delenv("SPECFLEET_API_KEY", raising=False)
    facts = {FileStates: {SERVICE.api_key_file: file("640", "root", "sglang", KEY)}}
    commands, noops = run(api_key.api_key, facts, service=SERVICE)
    assert commands == []
    assert noops == [f"no $SPECFLEET_API_KEY on the controller: {SERVICE.api_key_file} kept (remove_api_key=true removes it)"]


def test_the_key_is_removed_only_when_asked(monkeypatch):
    monkeypatch.delenv("SPECFLEET_API_KEY", raising=False)
    facts = {FileStates: {SERVICE.api_key_file: file("640", "root", "sglang", KEY)}}
    commands, _ = run(api_key.api_key, facts, service=REMOVING.engine.service)
    assert commands == [f"rm -f {SERVICE.api_key_file}"]
    commands, noops = run(api_key.api_key, {FileStates: {SERVICE.api_key_file: None}}, service=REMOVING.engine.service)
    assert commands == [] and "absent, the server has no key" in noops[0]


def test_a_new_key_is_written_by_root_root_owned_0640_from_stdin(monkeypatch):
    monkeypatch.setenv("SPECFLEET_API_KEY", KEY)
    # The host's file holds another key, or the right one with the service user as owner (an old deploy's).
    for state in (file("640", "root", "sglang", "another-key-0123456789"), file("600", "sglang", "sglang", KEY)):
        [command] = yielded(api_key.api_key, {FileStates: {SERVICE.api_key_file: state}}, service=SERVICE)
        assert command.connector_arguments == {"_stdin": KEY}
        text = command.get_raw_value()
        assert KEY not in text and text.startswith("sh -c ") and text.endswith("secret /etc/specfleet api-key 640 sglang")
    commands, noops = run(api_key.api_key, {FileStates: {SERVICE.api_key_file: file("640", "root", "sglang", KEY)}},
                          service=SERVICE)
    assert commands == [] and noops == [f"{SERVICE.api_key_file} holds the key (0640, root:sglang)"]


@pytest.mark.parametrize("key", ["short-key", "has space 0123456789", "quote'0123456789abc", "new\nline0123456789",
                                 "x" * 513, "ünïcode-0123456789abc"])
def test_a_key_outside_the_alphabet_fails_the_host_without_showing_it(monkeypatch, key):
    monkeypatch.setenv("SPECFLEET_API_KEY", key)
    commands, _ = run(api_key.api_key, {FileStates: {SERVICE.api_key_file: None}}, service=SERVICE)
    [problem] = failure(commands)
    assert problem.startswith("host-1: $SPECFLEET_API_KEY must be 16 to 512 characters") and key not in problem


@pytest.mark.parametrize("key", ["-starts-with-a-dash-0123", "aGVsbG8gd29ybGQhIQ==+/_.~"])
def test_keys_with_a_leading_dash_or_base64_characters_are_accepted(monkeypatch, key):
    monkeypatch.setenv("SPECFLEET_API_KEY", key)
    [command] = yielded(api_key.api_key, {FileStates: {SERVICE.api_key_file: None}}, service=SERVICE)
    assert command.connector_arguments == {"_stdin": key}


def test_the_write_command_creates_the_file_with_its_mode_and_replaces_a_planted_link(tmp_path):
    """The host command itself, run here by sh: content without the stdin newline, final mode, link replaced."""
    import grp
    import os
    import subprocess

    target = tmp_path / "victim"
    target.write_text("untouched")
    (tmp_path / "api-key").symlink_to(target)
    group = grp.getgrgid(os.getgid()).gr_name
    command = secret_files.write_secret(KEY, str(tmp_path), "api-key", "640", group)
    subprocess.run(command.get_raw_value(), shell=True, check=True, input=KEY + "\n", text=True)
    written = tmp_path / "api-key"
    assert not written.is_symlink() and written.read_text() == KEY
    assert oct(written.stat().st_mode & 0o777) == "0o640"
    assert target.read_text() == "untouched"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["api-key", "victim"]  # no temporary file left


def test_the_worker_admin_key_is_generated_on_the_host_and_kept(tmp_path):
    """The host's own command makes it (64 hex digits, 0640, no key in any command or stdin); kept once there,
    its owner and mode put right."""
    import grp
    import os
    import subprocess

    [command] = yielded(api_key.admin_key, {FileStates: {SERVICE.admin_key_file: None}}, engine=D.engine)
    assert isinstance(command, StringCommand) and "_stdin" not in command.connector_arguments
    text = command.get_raw_value()
    assert text.endswith(f"secret /etc/specfleet admin-api-key 640 sglang") and "secrets.token_hex(32)" in text
    # The same command run here by sh, into this test's directory and group.
    group = grp.getgrgid(os.getgid()).gr_name
    here = text.rsplit(" secret ", 1)[0] + f" secret {tmp_path} admin-api-key 640 {group}"
    subprocess.run(here, shell=True, check=True)
    written = tmp_path / "admin-api-key"
    assert len(written.read_text()) == 64 and int(written.read_text(), 16) >= 0
    assert oct(written.stat().st_mode & 0o777) == "0o640" and sorted(p.name for p in tmp_path.iterdir()) == [written.name]
    commands, noops = run(api_key.admin_key, {FileStates: {SERVICE.admin_key_file: file("640", "root", "sglang", "k")}},
                          engine=D.engine)
    assert commands == [] and noops == ["/etc/specfleet/admin-api-key holds the host's key (0640, root:sglang)"]
    commands, _ = run(api_key.admin_key, {FileStates: {SERVICE.admin_key_file: file("644", "sglang", "sglang", "k")}},
                      engine=D.engine)
    assert commands == ["chown root:sglang /etc/specfleet/admin-api-key && chmod 640 /etc/specfleet/admin-api-key"]
