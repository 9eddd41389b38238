"""Settings that argparse accepts and SGLang's resolution or its startup refuses stop the deploy before any
restart; a change of SGLang build is built beside the running one, so that a refused deploy leaves it whole and
going back to it is a restart; the engine's own startup caps what a replica runs at once."""

import json
import shlex
import time

import pytest

from lab import fleet
from deployment.hosts import resolve
from tests.helpers import (REPO, SGLANG_UNIT, UNIT_FILE, changed_operations, main_pid, run_deploy, server_info,
                           write_group_data)
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
        "profiles['qwen36_ddtree']['attention_backend'] = 'trtllm_mha'\n"
        "profile = 'qwen36_ddtree'"))
    try:
        refused = run_deploy("--limit", host.name, group_data=old_backend)
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


# --- the engine's startup, after the weights load ---------------------------------------------------------
LAZY_ASSERTION = ("AssertionError: Lazy extra buffer requires overlap schedule "
                  "(--disable-overlap-schedule is incompatible)")
# Qwen3.6-27B's DDTree layout on the RTX PRO 6000 class, one TP 1 replica (the class runs eight alike), with
# the hybrid model's radix cache strategy as `strategy` names it. DDTree runs without the overlap scheduler.
QWEN_ONE_REPLICA = "layouts = dict(base['layouts'], qwen36_ddtree=dict(tp_size=1, context_length=163840, replicas=1))"
QWEN_UNIT = "sglang@qwen36_ddtree-gpu0"
KNOBS = "/etc/specfleet-lab/qwen36-sized.json"
SIZED = "/etc/specfleet-lab/qwen36-sized"  # the real checkpoints' configs and sparse weights, for sized_as
CONFIGS = REPO / "tests" / "fixtures" / "model_configs"


def qwen_layout(directory, strategy: str, env: dict | None = None):
    args = ["--trust-remote-code", "--page-size", "1", "--disable-overlap-schedule",
            "--mamba-radix-cache-strategy", strategy]
    write_group_data(directory, "all", (
        "profiles = copy.deepcopy(base['profiles'])\n"
        f"profiles['qwen36_ddtree']['server_args'] = {args!r}\n"
        f"profiles['qwen36_ddtree']['env'] = dict(base['profiles']['qwen36_ddtree']['env'], **{env or {}!r})\n"
        "profile = 'qwen36_ddtree'"))
    return write_group_data(directory, "rtx_pro_6000_pcie", QWEN_ONE_REPLICA)


@pytest.fixture(scope="module")
def qwen_on_pcie(deployed_lab, pcie_host):
    """The pcie host for Qwen3.6-27B's layouts; back to the lab's deploy (Kimi K2.6) afterwards."""
    yield pcie_host
    fleet.ssh(pcie_host, f"rm -rf {KNOBS} {SIZED}")
    restored = run_deploy("--limit", pcie_host.name)
    assert restored.returncode == 0, restored.output[-3000:]


def test_the_lazy_extra_buffer_without_overlap_is_refused_before_the_restart_as_the_engine_asserts(
        qwen_on_pcie, tmp_path):
    """DDTree forces the overlap scheduler off, and SGLang 0.5.23 asserts on the lazy extra buffer without it
    once its weights are loaded, when it sizes the pool: argparse and the post-init rules accept the pair. The
    deploy refuses it in one line quoting the engine, and the running server is left alone (the host's own
    engine check and the stand-in's startup refuse it alike: tests/unit/test_engine_check_startup.py,
    tests/lab_code/test_sglang_kv_pool.py)."""
    host = qwen_on_pcie
    unit_state = f"systemctl show -p MainPID --value {SGLANG_UNIT}; sha1sum {UNIT_FILE}"
    before = fleet.ssh(host, unit_state)
    refused = run_deploy("--limit", host.name, group_data=qwen_layout(tmp_path, "extra_buffer_lazy"))
    assert refused.returncode != 0
    assert [line for line in refused.output.splitlines()
            if f"{host.name}: " in line and LAZY_ASSERTION in line], refused.output[-3000:]
    assert fleet.ssh(host, unit_state) == before, "the running server was touched although its engine refused"
    assert fleet.ssh(host, f"test -e /etc/systemd/system/{QWEN_UNIT}.service && echo written || echo none",
                     check=False).strip() == "none"


def test_a_qwen_replica_on_one_rtx_pro_6000_runs_the_engines_few_requests_and_queues_the_rest(
        qwen_on_pcie, tmp_path):
    """Sized for the real Qwen3.6-27B and its drafter (the sized_as knob: their config.json and sparse weight
    files of their sizes), a TP 1 replica reports the engine's own cap on running requests, a handful bound by
    its state slots where DFLASH's resolution says 48, and a load of 8 requests runs that many and queues the
    rest."""
    host = qwen_on_pcie
    drafter = {**json.loads((CONFIGS / "Qwen3-4B.json").read_text()), "architectures": ["DFlashDraftModel"],
               "num_hidden_layers": 5}  # z-lab's Qwen3.6 drafter: five Qwen3-4B-shaped layers, ~3.5 GB
    for role, config, size in (("target", (CONFIGS / "Qwen3.6-27B.json").read_text(), 54 * 10**9),
                               ("drafter", json.dumps(drafter), 35 * 10**8)):
        fleet.ssh(host, f"mkdir -p {SIZED}/{role} && echo {shlex.quote(config)} > {SIZED}/{role}/config.json && "
                        f"truncate -s {size} {SIZED}/{role}/model.safetensors")
    sized_as = {"sized_as": {"target": f"{SIZED}/target", "drafter": f"{SIZED}/drafter"}}
    fleet.ssh(host, f"echo {shlex.quote(json.dumps(sized_as))} > {KNOBS}")
    deployed = run_deploy("--limit", host.name,
                          group_data=qwen_layout(tmp_path, "extra_buffer", {"SPECFLEET_SGLANG_KNOBS": KNOBS}))
    assert deployed.returncode == 0, deployed.output[-3000:]
    info = server_info(host)
    cap = info["internal_states"][0]["effective_max_running_requests_per_dp"]
    print(f"Qwen3.6-27B TP 1 on RTX PRO 6000: max_running_requests {info['max_running_requests']} resolved, "
          f"{cap} sized; max_total_num_tokens {info['max_total_num_tokens']}")
    assert info["max_running_requests"] == 48 and 2 <= cap <= 8
    load = fleet.ssh(host, (
        "for i in $(seq 8); do curl -s -m 120 -o /dev/null localhost:30000/generate "
        "-d '{\"text\": \"request '$i'\", \"sampling_params\": {\"max_new_tokens\": 3000}}' & done; "
        "sleep 4; curl -s localhost:30000/v1/loads; kill $(jobs -p) 2>/dev/null; wait"), timeout=180)
    (snapshot,) = json.loads(load)["loads"]
    assert (snapshot["num_running_reqs"], snapshot["num_waiting_reqs"]) == (cap, 8 - cap), snapshot
    assert snapshot["max_running_requests"] == cap


def test_a_server_once_unhealthy_that_generates_is_judged_serving_not_restarted(deployed_lab, b200_host):
    """After one failed health check SGLang stays UnHealthy and /ready answers 503 until a health check that
    generates clears it (0.5.23 http_server.py). The deploy's readiness asks /health_generate where /ready
    refuses: a working server is left running, and is ready again after it."""
    knobs = "/etc/specfleet-lab/sglang-standin.json"  # the stand-in's default knobs file, read per request
    fleet.ssh(b200_host, f"echo '{{\"health_fail\": true}}' > {knobs}")
    try:
        assert fleet.ssh(b200_host, "curl -s -o /dev/null -w '%{http_code}' localhost:30000/health") == "503"
    finally:
        fleet.ssh(b200_host, f"rm -f {knobs}")
    ready = "curl -s -o /dev/null -w '%{http_code}' localhost:30000/ready"
    assert fleet.ssh(b200_host, ready) == "503"  # still UnHealthy: nothing has generated since
    pid = main_pid(b200_host)
    again = run_deploy("--limit", b200_host.name)
    assert again.returncode == 0, again.output[-3000:]
    assert main_pid(b200_host) == pid and fleet.ssh(b200_host, ready) == "200"
