"""pyinfra facts about a host's NVIDIA GPUs: one fact per subject, one shell command each.

Every command exits 0: a host without nvidia-smi gives the fact's default (None), not a
failed host, so that preflight can say what is missing instead of stopping on an error.
"""

from __future__ import annotations

from typing_extensions import override

from pyinfra.api import FactBase

from .parse import (
    parse_proc_driver_version,
    parse_query_csv,
    parse_smi_q,
    parse_topology,
    smi_failure,
)

GPU_QUERY_FIELDS = [
    "index",
    "name",
    "memory.total",
    "compute_cap",
    "driver_version",
    "persistence_mode",
    "mig.mode.current",
]


def _if_nvidia_smi(command: str) -> str:
    # `|| true`: a failing nvidia-smi (no GPU, NVML error) must not fail the fact; callers
    # send its stderr to stdout where the error text matters to process().
    return f"if command -v nvidia-smi >/dev/null 2>&1; then {command} || true; fi"


EXIT_MARK = "@@nvidia-smi exit "


def unreadable(gpus) -> dict | None:
    """Why nvidia-smi could not read the GPUs (NvidiaGpus' value when it failed), else None."""
    return gpus.get("unknown") if isinstance(gpus, dict) else None


class NvidiaGpus(FactBase):
    """
    Returns the host's GPUs from ``nvidia-smi --query-gpu``; None without nvidia-smi. When
    nvidia-smi fails (a non-zero exit code: no driver loaded, NVML not initialised, a driver
    upgraded without a reboot) the GPUs are unknown, not zero: ``{"unknown": why}`` with its
    exit code, its words, their meaning and what to do (``parse.smi_failure``).

    .. code:: python

        [
            {
                "index": 0,
                "name": "NVIDIA H200",
                "memory_total_mib": 143771,
                "compute_capability": "9.0",
                "driver_version": "580.159.04",
                "persistence_mode": "Enabled",
                "mig_mode": "Disabled",
            },
        ]
        {"unknown": {"exit_code": 18, "message": "Failed to initialize NVML: Driver/library version mismatch; "
                     "NVML library version: 580.95", "cause": "...", "fix": "reboot the host ..."}}
    """

    host_answer = "gpu_state.gpus"

    @override
    def command(self) -> str:
        fields = ",".join(GPU_QUERY_FIELDS)
        # Its exit code says whether the output holds GPUs: nvidia-smi prints its errors on stdout.
        return ("if command -v nvidia-smi >/dev/null 2>&1; then "
                f"nvidia-smi --query-gpu={fields} --format=csv,noheader,nounits 2>&1; echo \"{EXIT_MARK}$?\"; fi")

    @override
    def process(self, output: list[str]) -> list[dict] | dict:
        codes = [int(line[len(EXIT_MARK):]) for line in output if line.startswith(EXIT_MARK)]
        lines = [line for line in output if not line.startswith(EXIT_MARK)]
        failure = smi_failure(lines, codes[-1] if codes else None)
        if failure:
            return dict(unknown=failure)
        return parse_query_csv(lines, GPU_QUERY_FIELDS)


class NvidiaTopology(FactBase):
    """
    Returns the links between every GPU pair from ``nvidia-smi topo -m`` and what they make
    the host: ``nvlink`` (every pair NV#), ``pcie`` (no pair NV#) or ``unknown`` (mixed, or
    fewer than two GPUs). ``degraded``: some pairs NVLink while some GPU has none.

    .. code:: python

        {
            "gpus": [0, 1],
            "links": {"0-1": "NV18"},
            "interconnect": "nvlink",
            "degraded": False,
            "gpus_without_nvlink": [],
        }
    """

    host_answer = "gpu_state.topology"

    @override
    def command(self) -> str:
        return _if_nvidia_smi("nvidia-smi topo -m 2>&1")

    @override
    def process(self, output: list[str]) -> dict:
        return parse_topology(output)


class NvidiaDriver(FactBase):
    """
    Returns the loaded NVIDIA driver: version, whether the kernel module is the open one
    (/proc/driver/nvidia/version), the CUDA version it supports and the device minor number of each GPU,
    in nvidia-smi's index order (``nvidia-smi -q``, which lists the GPUs in that order; the GPU at index 0
    is /dev/nvidia<its minor>, which need not be /dev/nvidia0). None when no driver is loaded.

    .. code:: python

        {
            "version": "580.159.04",
            "kernel_module_version": "580.159.04",
            "open_kernel_module": True,
            "cuda_version": "13.0",
            "gpu_minor_numbers": [2, 3, 0, 1, 6, 7, 4, 5],
        }
    """

    host_answer = "gpu_state.driver"

    @override
    def command(self) -> str:
        # The whole -q, as the host program runs it (gpu_state.py): -d keeps no GPU's Minor Number.
        return "cat /proc/driver/nvidia/version 2>/dev/null; " + _if_nvidia_smi("nvidia-smi -q 2>&1")

    @override
    def process(self, output: list[str]) -> dict | None:
        module = parse_proc_driver_version(output) or {}
        smi = parse_smi_q(output)
        version = smi["driver_version"] or module.get("version")
        if version is None:
            return None
        return dict(
            version=version,
            kernel_module_version=module.get("version"),
            open_kernel_module=module.get("open_kernel_module"),
            cuda_version=smi["cuda_version"],
            gpu_minor_numbers=[gpu.get("minor_number") for gpu in smi["gpus"]],
        )


FABRIC_UNITS = ["nvidia-fabricmanager", "nvidia-persistenced"]


class NvidiaFabric(FactBase):
    """
    Returns NVSwitch presence, the state of the fabric-related units, the installed fabric
    packages (dpkg), whether ``ib_umad`` is loaded, and each GPU's fabric registration from
    ``nvidia-smi -q``. A unit's ``enabled`` is None when it is not installed (or the host has
    no systemd).

    .. code:: python

        {
            "nvswitch": True,
            "units": {
                "nvidia-fabricmanager": {"enabled": "enabled", "active": "active"},
                "nvidia-persistenced": {"enabled": "enabled", "active": "active"},
            },
            "packages": {"nvidia-fabricmanager": "580.95.05-1", "nvlsm": "2025.06.1-1"},
            "ib_umad_loaded": True,
            "gpus": [
                {"pci_bus_id": "00000000:00:06.0", "fabric_state": "Completed", "fabric_status": "Success"},
            ],
        }
    """

    host_answer = "gpu_state.fabric"

    @override
    def command(self) -> str:
        units = " ".join(FABRIC_UNITS)
        return (
            'if [ -n "$(ls -A /proc/driver/nvidia-nvswitch/devices 2>/dev/null)" ]; '
            "then echo 'nvswitch: present'; else echo 'nvswitch: absent'; fi; "
            f"for unit in {units}; do "
            'echo "unit: $unit enabled=$(systemctl is-enabled $unit.service 2>/dev/null) '
            'active=$(systemctl is-active $unit.service 2>/dev/null)"; done; '
            "if [ -d /sys/module/ib_umad ]; then echo 'ib_umad: loaded'; fi; "
            "dpkg-query -W -f='package: ${Package} ${Version} ${db:Status-Status}\\n' "
            "'nvidia-fabricmanager*' nvlsm 2>/dev/null; "
            # Only the GPU headers and the Fabric section of -q: the rest is large.
            + _if_nvidia_smi(
                "nvidia-smi -q 2>/dev/null | awk '/^GPU /{print; next} /^    Fabric$/{fabric=1; print; next} "
                "fabric && /^        [A-Za-z]/{print; next} {fabric=0}'"
            )
        )

    @override
    def process(self, output: list[str]) -> dict:
        units, packages = {}, {}
        for line in output:
            if line.startswith("package: "):
                name, version, status = (line[len("package: "):].split() + ["", ""])[:3]
                if status == "installed":
                    packages[name] = version
            if line.startswith("unit: "):
                name, *states = line[len("unit: "):].split()
                state = dict(state.partition("=")[::2] for state in states)
                enabled = state.get("enabled") or None
                units[name] = dict(
                    enabled=None if enabled == "not-found" else enabled,
                    active=state.get("active") or None,
                )
        return dict(
            nvswitch="nvswitch: present" in output,
            units=units,
            packages=packages,
            ib_umad_loaded="ib_umad: loaded" in output,
            gpus=[
                dict(pci_bus_id=gpu["pci_bus_id"], fabric_state=gpu.get("fabric_state"),
                     fabric_status=gpu.get("fabric_status"))
                for gpu in parse_smi_q(output)["gpus"]
            ],
        )


class RebootPending(FactBase):
    """
    Returns why the host needs a reboot: the distribution's flag file, or nvidia-smi failing
    with a driver/library version mismatch after a driver upgrade. Empty list: none needed.

    .. code:: python

        ["/var/run/reboot-required exists", "Failed to initialize NVML: Driver/library version mismatch"]
    """

    host_answer = "gpu_state.reboot_pending"

    default = list

    @override
    def command(self) -> str:
        return (
            "if [ -e /var/run/reboot-required ]; then echo '/var/run/reboot-required exists'; fi; "
            + _if_nvidia_smi("nvidia-smi -L 2>&1 | grep -i 'version mismatch'")
        )

    @override
    def process(self, output: list[str]) -> list[str]:
        return [line.strip() for line in output if line.strip()]


class NvidiaHost(FactBase):
    """
    Returns the GPUs, topology, driver and pending reboot (the facts above) from ONE command,
    so preflight costs one SSH round trip instead of four. Each part is parsed by its own
    fact's ``process()`` and is that fact's default when its command printed nothing.

    .. code:: python

        {"NvidiaGpus": [...], "NvidiaTopology": {...}, "NvidiaDriver": {...}, "RebootPending": []}
    """

    PARTS = (NvidiaGpus, NvidiaTopology, NvidiaDriver, RebootPending)
    MARK = "@@specfleet-part "

    @staticmethod
    def default() -> dict:
        # A host that printed nothing has none of the parts, not no GPU state at all.
        return {part.__name__: part.default() for part in NvidiaHost.PARTS}

    @override
    def command(self) -> str:
        return "; ".join(f"echo '{self.MARK}{part.__name__}'; {part().command()}" for part in self.PARTS)

    @override
    def process(self, output: list[str]) -> dict:
        lines: dict[str, list[str]] = {}
        for line in output:
            if line.startswith(self.MARK):
                current = lines.setdefault(line[len(self.MARK):].strip(), [])
            else:
                current.append(line)
        return {part.__name__: part().process(lines[part.__name__]) if lines.get(part.__name__) else part.default()
                for part in self.PARTS}
