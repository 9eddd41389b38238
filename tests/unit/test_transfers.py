"""Files moved under --sudo: staged in a private directory of their own, never at pyinfra's
/tmp/pyinfra-<sha1> that any local user may create first (operations/basics/shell.py)."""

import re
from types import SimpleNamespace

from pyinfra.api import FunctionCommand
from pyinfra.api.command import FileUploadCommand
from pyinfra.facts.files import Directory, File

from deployment.hosts import resolve
from operations.basics import shell
from serving_benchmark import client
from serving_benchmark.plan import plan
from tests.unit.fakehost import run
from tests.unit.group_data import host_data

PRIVATE = re.compile(r"/tmp/specfleet-transfer-[0-9a-f]{32}")


def uploads(arguments: dict) -> list:
    d = resolve(host_data("rtx_pro_6000_pcie", lab=True), "rtx_pro_6000_pcie")
    commands, _ = run(client.prompts, {File: None, Directory: None}, arguments, service=d.host.service, plan=plan({}))
    return commands


def test_an_upload_under_sudo_is_staged_in_a_private_directory_made_and_removed_around_it():
    make, upload, remove = [c for c in uploads({"_sudo": True}) if not isinstance(c, str)]
    [directory] = make.args
    assert PRIVATE.fullmatch(directory) and make.function is shell._make_private
    assert isinstance(upload, FileUploadCommand) and upload.remote_temp_filename == f"{directory}/upload"
    assert remove.function is shell._remove_private and remove.args == (directory,)
    [other] = [c.args[0] for c in uploads({"_sudo": True}) if isinstance(c, FunctionCommand)][:1]
    assert other != directory  # a name of its own per transfer, never one computed from the destination


def test_an_upload_as_root_goes_straight_to_its_destination():
    [upload] = [c for c in uploads({}) if not isinstance(c, str)]
    assert isinstance(upload, FileUploadCommand)


class RecordingHost:
    """Records what a transfer asks of pyinfra's host, with which escalation."""

    name = "host-1"

    def __init__(self, arguments: dict):
        self.current_op_global_arguments, self.calls = arguments, []

    def run_shell_command(self, command, **arguments):
        self.calls.append((str(command), arguments))
        return True, SimpleNamespace(stderr_lines=[])

    def get_file(self, remote, local, **arguments):
        self.calls.append((f"get {remote}", arguments))
        return True


def test_a_download_under_sudo_copies_through_a_private_directory_the_login_makes():
    host = RecordingHost({"_sudo": True})
    assert shell.get_file(host, "/opt/specfleet/bench/level.tar.gz", "/tmp/local.tar.gz")
    (make, as_login), (get, escalated), (remove, as_login_again) = host.calls
    directory = make.split()[-1]
    assert PRIVATE.fullmatch(directory) and make == f"mkdir -m 700 -- {directory}" and as_login == {}
    assert get == "get /opt/specfleet/bench/level.tar.gz"
    assert escalated == {"_sudo": True, "remote_temp_filename": f"{directory}/download"}
    assert remove == f"rm -rf -- {directory}" and as_login_again == {}
    root = RecordingHost({})
    assert shell.get_file(root, "/x", "/tmp/x") and root.calls == [("get /x", {})]
