"""operations.gpu.nvidia: facts in, commands out (the operation generator run on a fake host)."""

from pyinfra.api.command import FunctionCommand
from pyinfra.context import ctx_host

from operations.gpu import nvidia
from operations.gpu.facts import NvidiaDriver, NvidiaFabric, NvidiaGpus


class FakeHost:
    """Just what the operations use of pyinfra's Host: get_fact and noop."""

    def __init__(self, facts):
        self.facts = facts
        self.noops = []

    def get_fact(self, fact_class, *args, **kwargs):
        return self.facts[fact_class]

    name = "gpu-host"

    def noop(self, description):
        self.noops.append(description)


def run(operation, facts, **kwargs):
    """Return (commands, noops); a FunctionCommand shows as its function's name."""
    host = FakeHost(facts)
    with ctx_host.use(host):
        commands = [
            command.function.__name__ if isinstance(command, FunctionCommand) else str(command)
            for command in operation._inner(**kwargs)
        ]
    return commands, host.noops


def failures(operation, facts, **kwargs):
    """The problems an operation fails its host with (operations.failure.fail_host)."""
    with ctx_host.use(FakeHost(facts)):
        commands = list(operation._inner(**kwargs))
    assert len(commands) == 1 and isinstance(commands[0], FunctionCommand), commands
    return commands[0].args[0]


def fabric(units=None, packages=None, ib_umad_loaded=False):
    return dict(nvswitch=True, units=units or {}, packages=packages or {}, ib_umad_loaded=ib_umad_loaded, gpus=[])


UP = dict(enabled="enabled", active="active")
DRIVER_580 = dict(version="580.95.05", kernel_module_version="580.95.05", open_kernel_module=True, cuda_version="13.0")
B200_GPUS = [dict(index=i, name="NVIDIA B200", compute_capability="10.0") for i in range(8)]
H200_GPUS = [dict(index=0, name="NVIDIA H200", compute_capability="9.0")]
FM_580 = {"nvidia-fabricmanager": "580.95.05-1", "nvlsm": "2025.06.1-1"}


def test_persistence_daemon_enabled_and_started():
    down = fabric({"nvidia-persistenced": dict(enabled="disabled", active="inactive")})
    commands, _ = run(nvidia.persistence_daemon, {NvidiaFabric: down})
    assert commands == ["systemctl enable nvidia-persistenced.service", "systemctl start nvidia-persistenced.service"]


def test_persistence_daemon_noop():
    commands, noops = run(nvidia.persistence_daemon, {NvidiaFabric: fabric({"nvidia-persistenced": UP})})
    assert commands == [] and noops == ["nvidia-persistenced is enabled and active"]


def test_persistence_daemon_missing_is_an_error():
    [problem] = failures(nvidia.persistence_daemon, {NvidiaFabric: fabric()})
    assert problem.startswith("gpu-host: ") and "install the driver first" in problem


def test_fabric_manager_fresh_blackwell_host():
    commands, _ = run(nvidia.fabric_manager, {NvidiaDriver: DRIVER_580, NvidiaFabric: fabric(), NvidiaGpus: B200_GPUS})
    assert commands == [
        "DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends --allow-downgrades "
        "--allow-change-held-packages 'nvidia-fabricmanager=580.95.05-*' nvlsm",
        "modprobe ib_umad",
        "echo ib_umad > /etc/modules-load.d/ib_umad.conf",
        "systemctl enable nvidia-fabricmanager.service",
        "systemctl start nvidia-fabricmanager.service",
    ]


def test_fabric_manager_before_580_is_named_per_branch_and_hopper_needs_no_nvlsm():
    driver = dict(DRIVER_580, version="570.158.01")
    commands, _ = run(nvidia.fabric_manager, {NvidiaDriver: driver, NvidiaFabric: fabric(), NvidiaGpus: H200_GPUS})
    assert commands[0].endswith(" 'nvidia-fabricmanager-570=570.158.01-*'")
    assert "modprobe ib_umad" not in commands


def test_fabric_manager_from_the_vendor_image_is_only_started():
    facts = {
        NvidiaDriver: DRIVER_580,
        NvidiaFabric: fabric({"nvidia-fabricmanager": dict(enabled="enabled", active="inactive")},
                             packages=FM_580, ib_umad_loaded=True),
        NvidiaGpus: B200_GPUS,
    }
    commands, _ = run(nvidia.fabric_manager, facts)
    assert commands == ["systemctl start nvidia-fabricmanager.service"]


def test_fabric_manager_noop():
    facts = {
        NvidiaDriver: DRIVER_580,
        NvidiaFabric: fabric({"nvidia-fabricmanager": UP}, packages=FM_580, ib_umad_loaded=True),
        NvidiaGpus: B200_GPUS,
    }
    commands, noops = run(nvidia.fabric_manager, facts)
    assert commands == [] and noops == ["nvidia-fabricmanager is enabled and active for driver 580.95.05"]


def test_fabric_manager_at_another_version_than_the_driver_is_replaced_and_restarted():
    facts = {
        NvidiaDriver: DRIVER_580,
        NvidiaFabric: fabric({"nvidia-fabricmanager": UP}, packages={**FM_580, "nvidia-fabricmanager": "580.82.07-1"},
                             ib_umad_loaded=True),
        NvidiaGpus: B200_GPUS,
    }
    commands, _ = run(nvidia.fabric_manager, facts)
    assert commands == [
        "DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends --allow-downgrades "
        "--allow-change-held-packages 'nvidia-fabricmanager=580.95.05-*'",
        "systemctl restart nvidia-fabricmanager.service",
    ]


def test_fabric_manager_needs_a_driver():
    [problem] = failures(nvidia.fabric_manager, {NvidiaDriver: None, NvidiaFabric: fabric(), NvidiaGpus: None})
    assert "no NVIDIA driver" in problem


def test_fabric_manager_masked():
    masked = fabric({"nvidia-fabricmanager": dict(enabled="masked", active="inactive")}, packages=FM_580)
    facts = {NvidiaDriver: DRIVER_580, NvidiaFabric: masked, NvidiaGpus: H200_GPUS}
    [problem] = failures(nvidia.fabric_manager, facts)
    assert "systemctl unmask nvidia-fabricmanager" in problem
