"""The Hugging Face token under verbose, debug and failing deploys: only ever in its 0600 file."""

import pytest

from lab import fleet
from tests.helpers import run_deploy, write_group_data
from tests.faults.faultlab import record, secret_locations

pytestmark = pytest.mark.lab

TOKEN = "hf_lab_granted"
TOKEN_FILE = "/home/sglang/.cache/huggingface/token"


def drop_token_files(hosts) -> None:
    """So the deploy uploads the token again (an unchanged file is not uploaded, and so not tested)."""
    for host in hosts:
        fleet.ssh(host, f"rm -f {TOKEN_FILE}")


def uploaded_again(hosts) -> None:
    for host in hosts:
        assert fleet.ssh(host, f"test -f {TOKEN_FILE} && echo yes", check=False).strip() == "yes", \
            f"{host.name}: the deploy did not upload the token"


def test_token_only_in_its_0600_file_after_verbose_debug_and_failing_deploys(deployed_lab, lab_hosts, tmp_path):
    # A step after the upload fails on every host: SGLang rejects a flag.
    failing = write_group_data(tmp_path, "all", (
        "profiles = copy.deepcopy(base['profiles'])\n"
        "profiles['kimi_k26_dflash']['server_args'] = [*profiles['kimi_k26_dflash']['server_args'], "
        "'--reasoning-parser', 'no-such-parser']"))
    drop_token_files(lab_hosts)
    failed = run_deploy("-vvv", "--debug", group_data=failing)
    assert failed.returncode != 0 and "rejects the rendered flags" in failed.output, failed.output[-3000:]
    assert "Hugging Face token" in failed.output
    uploaded_again(lab_hosts)
    drop_token_files(lab_hosts)
    passed = run_deploy("-vvv", "--debug")
    assert passed.returncode == 0, passed.output[-3000:]
    uploaded_again(lab_hosts)
    for run in (failed, passed):
        assert TOKEN not in run.output
    for host in lab_hosts:
        assert fleet.ssh(host, f"stat -c '%a %U' {TOKEN_FILE}").split() == ["600", "sglang"]
        assert fleet.ssh(host, f"stat -c '%a' {TOKEN_FILE.rsplit('/', 1)[0]}").strip() == "700"
        # Not in any unit or environment file, process argv or environment, log file or journal line.
        assert secret_locations(host, TOKEN) == [TOKEN_FILE]
    record("token secrecy", result="only in the 0600 file", runs="-vvv --debug failing + passing",
           output_bytes_checked=len(failed.output) + len(passed.output))
