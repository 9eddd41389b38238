"""Settings that argparse accepts and SGLang's resolution refuses stop the deploy before any restart."""

import pytest

from lab import fleet
from tests.helpers import SGLANG_UNIT, UNIT_FILE, run_deploy, write_group_data

pytestmark = pytest.mark.lab


def test_a_setting_only_resolution_refuses_stops_before_the_restart(deployed_lab, b200_host, tmp_path):
    """DDTree on B200 with trtllm_mha: every flag parses, but trtllm_mha forces the page size to 64 and
    DDTree needs 1. The host's own SGLang (the DDTree build) refuses it when the deploy
    validates the unit, and the running server is left alone."""
    unit_state = f"systemctl show -p MainPID --value {SGLANG_UNIT}; sha1sum {UNIT_FILE}"
    before = fleet.ssh(b200_host, unit_state)
    old_backend = write_group_data(tmp_path, "all", (
        "profiles = copy.deepcopy(base['profiles'])\n"
        "profiles['qwen36_ddtree']['attention_backend'] = 'trtllm_mha'"))
    try:
        refused = run_deploy("--limit", b200_host.name, "--data", "profile=qwen36_ddtree", group_data=old_backend)
        assert refused.returncode != 0
        assert "rejects the rendered flags (ValueError: DDTREE currently supports only page_size == 1)" in \
            refused.output, refused.output[-3000:]
        assert fleet.ssh(b200_host, unit_state) == before, "the service was touched although SGLang refused its flags"
    finally:
        # The refused deploy had built the Qwen profile's SGLang (the DDTree build) into the host's venv before
        # its flags were judged: the lab as it was for the tests after this one.
        assert run_deploy("--limit", b200_host.name).returncode == 0
