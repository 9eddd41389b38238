"""The GPUs, their interconnect and fabric are what the host's class (group_data/<class>.py `gpu`) says.

Read through the deploy's own facts (operations/gpu/facts.py: the same nvidia-smi
commands and parsers) and judged by the same checks as preflight, batched into one command.
"""

from operations.gpu.checks import check_fabric, check_gpu_class
from operations.gpu.facts import NvidiaDriver, NvidiaFabric, NvidiaGpus, NvidiaTopology, RebootPending
from operations.gpu.smoke import GpuSmokeRecord, summary


def gpu_facts(target) -> dict:
    return target.memo("gpu", lambda: target.facts(
        gpus=NvidiaGpus(), topology=NvidiaTopology(), driver=NvidiaDriver(), reboot=RebootPending(),
        fabric=NvidiaFabric(), smoke=(GpuSmokeRecord(), dict(path=target.deployment.host.smoke.record_path))))


def test_gpus_and_interconnect_match_the_class(target):
    facts = gpu_facts(target)
    problems = check_gpu_class(target.name, target.host_class, target.deployment.host.gpu.expected, facts["gpus"],
                               facts["topology"], facts["driver"], facts["reboot"])
    assert not problems, "\n".join(problems)


def test_persistence_mode_is_on_for_every_gpu(target):
    gpus = gpu_facts(target)["gpus"] or []
    off = [f"GPU {gpu.get('index')} {gpu.get('persistence_mode')}" for gpu in gpus
           if gpu.get("persistence_mode") != "Enabled"]
    assert gpus and not off, (f"{target.name}: expected persistence mode Enabled on every GPU, found "
                              f"{', '.join(off) or 'no GPUs'}: check nvidia-persistenced")
    daemon = gpu_facts(target)["fabric"]["units"].get("nvidia-persistenced", {})
    assert (daemon.get("enabled"), daemon.get("active")) == ("enabled", "active"), (
        f"{target.name}: expected nvidia-persistenced enabled/active, found "
        f"{daemon.get('enabled')}/{daemon.get('active')}")


def test_fabric_manager_as_the_class_needs(target):
    """NVSwitch classes: fabric manager active, every GPU's fabric Completed. PCIe: no fabric manager."""
    problems = check_fabric(target.name, target.host_class, target.deployment.host.gpu.expected, gpu_facts(target)["fabric"])
    assert not problems, "\n".join(problems)


def test_gpu_smoke_test_passed_in_this_boot(target):
    """The deploy's NCCL all-reduce across all GPUs (operations/gpu/smoke.py) passed since the host
    last booted, on every GPU, at or above the class's bus bandwidth floor."""
    found = gpu_facts(target)["smoke"]
    record, floor = found["record"], target.deployment.host.gpu.expected.allreduce_floor_gbps
    assert record, (f"{target.name}: expected the GPU smoke test's record {target.deployment.host.smoke.record_path}, "
                    "found none: run the deploy")
    problems = []
    if record.get("verdict") != "passed":
        problems.append(summary(record))
    if record.get("boot_id") != found["boot_id"]:
        problems.append(f"tested in boot {record.get('boot_id')}, this is boot {found['boot_id']}: the host rebooted "
                        "since; run the deploy to test again")
    if record.get("gpus") != target.deployment.host.gpu.expected.count:
        problems.append(f"tested {record.get('gpus')} GPUs, the class has {target.deployment.host.gpu.expected.count}")
    if record.get("floor_gbps") != floor or (record.get("busbw_gbps") or 0) < floor:
        problems.append(f"bus bandwidth {record.get('busbw_gbps')} GB/s against floor {record.get('floor_gbps')}, "
                        f"the class's floor is {floor}")
    assert not problems, f"{target.name}: expected a passed GPU smoke test, found " + "; ".join(problems)
