"""operations.gpu.smoke: facts in, commands out (the operation generator run on a fake host)."""

import dataclasses
import json
import shlex

import pytest
from pyinfra.api.command import FunctionCommand
from pyinfra.context import ctx_host

from pathlib import Path

from deployment.hosts import resolve
from deployment.knobs import BadHostData
from operations.gpu import smoke
from operations.gpu.smoke import GpuSmokeRecord
from tests.unit.group_data import host_data

BOOT = "5e0c8c1e-0000-4000-8000-000000000001"
REPO = Path(__file__).resolve().parents[2]


class FakeHost:
    """Just what the operation uses of pyinfra's Host: get_fact, noop and log_styled."""

    name = "gpu-host"

    def __init__(self, record):
        self.record = record
        self.noops, self.logged = [], []

    def get_fact(self, fact_class, **kwargs):
        assert fact_class is GpuSmokeRecord and kwargs == {"path": "/opt/specfleet/gpu-smoke.json"}
        return dict(boot_id=BOOT, record=self.record)

    def noop(self, description):
        self.noops.append(description)

    def log_styled(self, text, **kwargs):
        self.logged.append(text)


def smoke_test(host_class="b200_nvlink", **changes):
    return dataclasses.replace(resolve(host_data(host_class), host_class).host.smoke, **changes)


def run(record, test=None):
    host = FakeHost(record)
    with ctx_host.use(host):
        commands = list(smoke.allreduce._inner(smoke=test or smoke_test()))
    return commands, host


def passed(test=None, **changes):
    return dict(verdict="passed", reason="", key=smoke.smoke_key(test or smoke_test()), boot_id=BOOT, gpus=8,
                floor_gbps=150.0, engine="torch.distributed+NCCL", seconds=6.2, busbw_gbps=312.99,
                results=[dict(bytes=512 << 20, seconds=0.0017, correct=True, busbw_gbps=312.99)], **changes)


def test_first_run_tests_as_the_service_user_with_the_sglang_venv_and_the_class_floor():
    [command], host = run(None)
    assert isinstance(command, FunctionCommand) and command.function.__name__ == "_run_smoke_test"
    assert command.args[1] == "/opt/specfleet/gpu-smoke.json"  # where root writes what it printed
    assert command.args[0].startswith("cd / && ")
    argv = shlex.split(command.args[0].removeprefix("cd / && "))
    python = argv.index(f"{smoke_test().venv}/bin/python")
    assert smoke_test().venv == resolve(host_data("b200_nvlink"), "b200_nvlink").engine.venv
    assert argv[:5] == ["runuser", "-u", "sglang", "--", "env"]
    assert argv[5:python] == [f"{k}={v}" for k, v in sorted(smoke_test().env.items())]
    assert argv[python + 1:] == ["/opt/specfleet/bin/gpu_smoke.py", "--floor-gbps", "150.0", "--timeout", "180",
                                 "--previous", "/opt/specfleet/gpu-smoke.json", "--key", smoke.smoke_key(smoke_test())]
    assert host.noops == []


def test_the_units_environment_reaches_no_process_of_roots():
    """Whatever names the data's environment holds (LD_PRELOAD, PYTHONPATH, NCCL_DEBUG_FILE reach a
    process and what it loads or writes) are set only after runuser has become the service user."""
    env = {"LD_PRELOAD": "/tmp/x.so", "PYTHONPATH": "/tmp/py", "NCCL_DEBUG_FILE": "/etc/specfleet/x"}
    [command], _ = run(None, smoke_test(env=env))
    argv = shlex.split(command.args[0].removeprefix("cd / && "))
    first = min(argv.index(f"{name}={value}") for name, value in env.items())
    assert argv[:4] == ["runuser", "-u", "sglang", "--"] and argv.index("env") == 4 < first


def test_a_pcie_class_tries_p2p_within_a_third_of_the_time_against_its_p2p_floor():
    d = resolve(host_data("rtx_pro_6000_pcie", lab=True), "rtx_pro_6000_pcie").host.smoke
    [command], _ = run(None, d)
    argv = shlex.split(command.args[0].removeprefix("cd / && "))
    # P2P is the host's decision, not the class's; NCCL's bootstrap stays on loopback as the server's does.
    assert [arg for arg in argv if arg.startswith("NCCL_")] == ["NCCL_SOCKET_IFNAME=lo"]
    assert argv[argv.index("--floor-gbps") + 1] == "5.0"
    assert argv[argv.index("--timeout") + 1] == "60"  # the lab's gpu_smoke_timeout_s
    assert argv[argv.index("--p2p-floor-gbps") + 1] == "30.0" and argv[argv.index("--p2p-timeout") + 1] == "20"
    assert "--engine" not in argv


def test_passed_in_this_boot_with_the_same_inputs_is_a_noop_that_prints_the_figures():
    commands, host = run(passed())
    assert commands == []
    assert host.noops == ["the GPU smoke test passed in this boot with this SGLang and NCCL environment"]
    assert host.logged == ["GPU smoke test passed: 8 GPUs, all-reduce bus bandwidth GB/s 512 MiB 312.99 "
                           "(floor 150) by torch.distributed+NCCL in 6.2 s"]


@pytest.mark.parametrize("change", [
    dict(boot_id="another-boot"),  # rebooted since: a new state
    dict(verdict="failed", reason="the all-reduce did not finish within 180 s"),
    dict(key=smoke.smoke_key(smoke_test(env={"NCCL_P2P_DISABLE": "1"}))),  # another NCCL environment
    dict(key=smoke.smoke_key(smoke_test(build="sglang==0.5.24"))),  # another torch/NCCL
])
def test_tested_again_when_anything_it_depends_on_changed(change):
    commands, host = run(dict(passed(), **change))
    assert [command.function.__name__ for command in commands] == ["_run_smoke_test"] and host.noops == []


def test_the_lab_engine_knob_is_gone_and_refused_by_name():
    with pytest.raises(BadHostData, match="gpu_smoke_engine='/usr/lib/specfleet-lab/gpu-allreduce-standin' is not "
                                          "accepted: the GPU smoke test always runs torch.distributed with NCCL "
                                          "from the SGLang venv; remove it"):
        resolve(host_data("b200_nvlink", gpu_smoke_engine="/usr/lib/specfleet-lab/gpu-allreduce-standin"),
                "b200_nvlink")
    assert "gpu_smoke_engine" not in (REPO / "group_data" / "all.py").read_text()
    assert "engine" not in {field.name for field in dataclasses.fields(smoke.SmokeTest)}


HUNG = dict(enabled=False, decided_by="measurement", floor_gbps=30.0,
            reason="the P2P all-reduce hung (no result within 60 s)", decided_at="2026-12-01T12:00:00Z")


def test_p2p_turned_off_by_measurement_reaches_the_unit_and_says_why_and_how_to_fix_it():
    record = dict(passed(), p2p=HUNG)
    assert smoke.unit_env(record) == {"NCCL_P2P_DISABLE": "1"}
    line = smoke.p2p_line(record, "/opt/specfleet/gpu-smoke.json")
    assert line.startswith("NCCL P2P off on this host: the P2P all-reduce hung (no result within 60 s); likely PCIe "
                           "ACS or the IOMMU routing peer-to-peer traffic through the CPU")
    assert "turn ACS and the IOMMU off in the BIOS (or boot with pci=noacs), then remove " \
           "/opt/specfleet/gpu-smoke.json and deploy again to try P2P again" in line
    earlier = dict(passed(), p2p=dict(HUNG, decided_by="an earlier measurement"))
    assert smoke.unit_env(earlier) == {"NCCL_P2P_DISABLE": "1"}
    assert "(since 2026-12-01T12:00:00Z)" in smoke.p2p_line(earlier, "/x")


@pytest.mark.parametrize("p2p", [
    dict(enabled=True, decided_by="measurement"),  # the host passed with P2P: it keeps it
    dict(enabled=True, decided_by="the class"),  # NVLink
    dict(enabled=False, decided_by="the environment"),  # the data's own NCCL_P2P_DISABLE=1: already in the unit
    dict(enabled=None, decided_by=None, reason="undecided: ..."),
    None,  # a record before P2P was decided
])
def test_nothing_reaches_the_unit_unless_a_measurement_turned_p2p_off(p2p):
    record = passed() if p2p is None else dict(passed(), p2p=p2p)
    assert smoke.unit_env(record) == {} and smoke.p2p_line(record, "/x") is None
    assert smoke.unit_env(None) == {}


def test_fact_reads_the_record_and_this_boot():
    line = json.dumps(passed())
    assert GpuSmokeRecord().process([BOOT, line]) == dict(boot_id=BOOT, record=passed())
    assert GpuSmokeRecord().process([BOOT]) == dict(boot_id=BOOT, record=None)
    assert GpuSmokeRecord().process([BOOT, "{truncated"]) == dict(boot_id=BOOT, record=None)


def test_every_class_has_a_floor_in_its_interconnects_territory():
    for host_class, low, high in [("rtx_pro_6000_pcie", 1, 28), ("b200_nvlink", 64, 313), ("b300_nvlink", 64, 313)]:
        assert low < smoke_test(host_class).expected.allreduce_floor_gbps < high, host_class


def test_root_writes_the_record_the_service_users_run_printed_from_stdin():
    """The record reaches its file on the second command's standard input (the first ran as the service user,
    who cannot write root's directory); the file is what the run printed, whole."""
    printed = dict(passed(), p2p=HUNG)
    calls = []

    class Ran:
        def __init__(self, lines):
            self.stdout_lines = lines

    class Host:
        current_op_global_arguments = {}  # root's login, no escalation

        def run_shell_command(self, command, **kwargs):
            calls.append((str(command), kwargs))
            return True, Ran(["NCCL chatter", json.dumps(printed)])

        def log_styled(self, text, **kwargs):
            calls.append(("log", text))

    assert smoke._run_smoke_test(None, Host(), "cd / && runuser -u sglang -- ...", "/opt/specfleet/gpu-smoke.json")
    (_, first), (write, kwargs) = calls[0], calls[1]
    assert first == {} and "/opt/specfleet/gpu-smoke.json" in write and json.loads(kwargs["_stdin"]) == printed
    assert [text for kind, text in calls[2:]] == [smoke.summary(printed), smoke.p2p_line(printed, "/opt/specfleet/gpu-smoke.json")]


@pytest.mark.parametrize("value, disabled", [("1", True), (" +1", True), ("10", False), ("0", False), ("", False)])
def test_the_environment_disables_p2p_as_nccl_reads_it(value, disabled):
    from tests.helpers import host_programs_importable
    host_programs_importable()
    import gpu_smoke
    assert gpu_smoke.p2p_disabled({"NCCL_P2P_DISABLE": value}) is disabled
