"""Settings that argparse accepts and SGLang's resolution refuses stop the deploy before any restart; a change
of SGLang build is built beside the running one, so that a refused deploy leaves it whole and going back to
it is a restart."""

import time

import pytest

from lab import fleet
from operations.deployment import resolve
from tests.helpers import SGLANG_UNIT, UNIT_FILE, changed_operations, run_deploy, write_group_data
from tests.unit.group_data import host_data

pytestmark = pytest.mark.lab


def tree_hash(host, venv: str) -> str:
    """Every path of the virtualenv with its type, size, mode and owner, and every file's bytes, hashed."""
    return fleet.ssh(host, f"cd {venv} && {{ find . -printf '%p %y %s %m %U %l\\n' | LC_ALL=C sort; "
                           "find . -type f -print0 | LC_ALL=C sort -z | xargs -0 sha256sum; } | sha256sum")


def starts(host, since: float) -> int:
    """How many times the replica's unit started since `since` (its journal's start messages)."""
    journal = fleet.ssh(host, f"journalctl -u {SGLANG_UNIT} -o cat --since=@{int(since)} --no-pager")
    return sum(line.startswith(f"Started {SGLANG_UNIT}") for line in journal.splitlines())


def python_of(host) -> str:
    """The virtualenv the replica's unit starts its Python from."""
    return fleet.ssh(host, f"systemctl show -p ExecStart --value {SGLANG_UNIT}").split("path=")[1].split("/bin/python")[0]


def test_a_setting_only_resolution_refuses_stops_before_the_restart_and_leaves_its_build_whole(deployed_lab,
                                                                                             b200_host, tmp_path):
    """DDTree on B200 with trtllm_mha: every flag parses, but trtllm_mha forces the page size to 64 and
    DDTree needs 1. The host's own SGLang (the DDTree build, built beside the running one) refuses it when
    the deploy validates the unit, and the running server is left alone, its virtualenv byte for byte.
    Then the running deployment moves to that build with one restart and no build, and back again."""
    host = b200_host
    release = resolve(host_data("b200_nvlink", lab=True), "b200_nvlink").engine.venv
    unit_state = f"systemctl show -p MainPID --value {SGLANG_UNIT}; sha1sum {UNIT_FILE}"
    before, release_tree = fleet.ssh(host, unit_state), tree_hash(host, release)
    assert python_of(host) == release
    old_backend = write_group_data(tmp_path / "refused", "all", (
        "profiles = copy.deepcopy(base['profiles'])\n"
        "profiles['qwen36_ddtree']['attention_backend'] = 'trtllm_mha'"))
    try:
        refused = run_deploy("--limit", host.name, "--data", "profile=qwen36_ddtree", group_data=old_backend)
        assert refused.returncode != 0
        assert "rejects the rendered flags (ValueError: DDTREE currently supports only page_size == 1)" in \
            refused.output, refused.output[-3000:]
        assert fleet.ssh(host, unit_state) == before, "the service was touched although SGLang refused its flags"
        assert tree_hash(host, release) == release_tree, f"{release} changed under its running server"
        # The running deployment takes the DDTree build (built by the refused deploy): one restart, no build.
        ddtree_build = write_group_data(tmp_path / "ddtree", "all", (
            "profiles = copy.deepcopy(base['profiles'])\n"
            "profiles['kimi_k26_dflash']['sglang'] = profiles['qwen36_ddtree']['sglang']"))
        since = time.time() - 1
        moved = run_deploy("--limit", host.name, group_data=ddtree_build)
        assert moved.returncode == 0, moved.output[-3000:]
        assert [op for op in changed_operations(moved.output) if op.startswith("SGLang (")] == [], moved.output[-3000:]
        assert python_of(host) != release and starts(host, since) == 1
        # Going back to the release build (the shared lab's deploy): its virtualenv was kept (the unit's
        # rollback names it), a restart.
        since = time.time() - 1
        back = run_deploy("--limit", host.name)
        assert back.returncode == 0, back.output[-3000:]
        assert [op for op in changed_operations(back.output) if op.startswith("SGLang (")] == [], back.output[-3000:]
        assert python_of(host) == release and starts(host, since) == 1
        assert tree_hash(host, release) == release_tree
    except BaseException:
        assert run_deploy("--limit", host.name).returncode == 0  # the lab as the tests after this one expect it
        raise
