"""operations.gpu.smoke: facts in, commands out (the operation generator run on a fake host)."""

import dataclasses
import json
import shlex

import pytest
from pyinfra.api.command import FunctionCommand
from pyinfra.context import ctx_host

from operations.deployment import resolve
from operations.gpu import smoke
from operations.gpu.smoke import GpuSmokeRecord
from operations.basics.knobs import BadHostData
from tests.unit.group_data import host_data

BOOT = "5e0c8c1e-0000-4000-8000-000000000001"


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
    return dataclasses.replace(resolve(host_data(host_class), host_class).smoke, **changes)


def run(record, test=None):
    host = FakeHost(record)
    with ctx_host.use(host):
        commands = list(smoke.allreduce._inner(smoke=test or smoke_test()))
    return commands, host


def passed(test=None, **changes):
    return dict(verdict="passed", reason="", key=smoke.smoke_key(test or smoke_test()), boot_id=BOOT, gpus=8,
                floor_gbps=150.0, engine="torch.distributed+NCCL", seconds=6.2, busbw_gbps=312.99,
                results=[dict(bytes=512 << 20, seconds=0.0017, correct=True, busbw_gbps=312.99)], **changes)


def test_first_run_tests_with_the_sglang_venv_and_the_class_floor():
    [command], host = run(None)
    assert isinstance(command, FunctionCommand) and command.function.__name__ == "_run_smoke_test"
    argv = shlex.split(command.args[0])
    python = argv.index("/opt/specfleet/sglang-venv/bin/python")
    assert argv[0] == "env" and argv[1:python] == [f"{k}={v}" for k, v in sorted(smoke_test().env.items())]
    assert argv[python + 1:] == ["/opt/specfleet/bin/gpu_smoke.py", "--floor-gbps", "150.0", "--timeout", "180",
                        "--record", "/opt/specfleet/gpu-smoke.json", "--key", smoke.smoke_key(smoke_test())]
    assert host.noops == []


def test_the_unit_nccl_environment_and_the_lab_engine_reach_the_command():
    d = resolve(host_data("rtx_pro_6000_pcie", lab=True), "rtx_pro_6000_pcie").smoke
    [command], _ = run(None, d)
    argv = shlex.split(command.args[0])
    assert [arg for arg in argv if arg.startswith("NCCL_")] == [f"{k}={v}" for k, v in sorted(d.env.items())
                                                                   if k.startswith("NCCL_")]
    assert argv[argv.index("--floor-gbps") + 1] == "5.0"
    assert argv[-2:] == ["--engine", "/usr/lib/specfleet-lab/gpu-allreduce-standin"]


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
    dict(key=smoke.smoke_key(smoke_test(engine="/usr/lib/specfleet-lab/gpu-allreduce-standin"))),
])
def test_tested_again_when_anything_it_depends_on_changed(change):
    commands, host = run(dict(passed(), **change))
    assert [command.function.__name__ for command in commands] == ["_run_smoke_test"] and host.noops == []


def test_an_engine_that_is_no_plain_absolute_path_is_refused_before_any_shell():
    for engine in ("standin; rm -rf /", "relative/standin", "/usr/lib/../bin/sh"):
        with pytest.raises(BadHostData, match="gpu_smoke_engine="):
            resolve(host_data("b200_nvlink", gpu_smoke_engine=engine), "b200_nvlink")


def test_fact_reads_the_record_and_this_boot():
    line = json.dumps(passed())
    assert GpuSmokeRecord().process([BOOT, line]) == dict(boot_id=BOOT, record=passed())
    assert GpuSmokeRecord().process([BOOT]) == dict(boot_id=BOOT, record=None)
    assert GpuSmokeRecord().process([BOOT, "{truncated"]) == dict(boot_id=BOOT, record=None)


def test_every_class_has_a_floor_in_its_interconnects_territory():
    for host_class, low, high in [("rtx_pro_6000_pcie", 1, 28), ("b200_nvlink", 64, 313), ("b300_nvlink", 64, 313)]:
        assert low < smoke_test(host_class).expected.allreduce_floor_gbps < high, host_class
