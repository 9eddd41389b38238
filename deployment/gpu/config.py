"""What a host class's GPUs must be and what the GPU concern does on such a host: typed, checked.

group_data/<class>.py says it (`expected_gpus`); `install_driver`, `driver_branch`, `nvidia_repo_url`
and `allow_http_nvidia_repo` (group_data/all.py) say whether and from where the deploy lays the driver down.
"""

import re
from dataclasses import dataclass
from typing import Any

from deployment import knobs, schema
from deployment.knobs import BadHostData


@dataclass(frozen=True)
class GpuExpectations:
    """What the hardware of a host class must be (group_data/<class>.py `expected_gpus`)."""

    name_patterns: tuple[str, ...]  # regexes over `nvidia-smi --query-gpu=name`
    count: int
    min_memory_mib: int
    compute_capability: str  # "12.0"
    interconnect: str  # "nvlink" (every pair NV#) or "pcie"
    driver_min: int  # driver branch
    open_kernel_module: bool
    fabric_manager: bool  # NVSwitch boards
    allreduce_floor_gbps: int  # GB/s: the GPU smoke test's all-reduce bus bandwidth floor (smoke.py)
    # GB/s: below it, PCIe peer-to-peer is turned off for the host (smoke.py); None: P2P is the
    # interconnect (NVLink), never turned off
    p2p_floor_gbps: int | None


@dataclass(frozen=True)
class GpuRuntime:
    """The GPU runtime one host gets: its class's expectations and, with `install_driver`, the driver
    branch laid down from NVIDIA's repository."""

    host_class: str
    expected: GpuExpectations
    install_driver: bool
    driver_branch: str  # digits, as the driver's version string starts
    nvidia_repo_url: str  # NVIDIA's CUDA repositories, <os release>/<arch>/ below it

    @property
    def nvidia_packages(self) -> bool:
        """Whether the host gets packages from NVIDIA's repository (the driver, or fabric manager)."""
        return self.install_driver or self.expected.fabric_manager


def expected_gpus(values: dict) -> GpuExpectations:
    """A class's `expected_gpus` dict (group_data/<class>.py) as the typed expectations."""
    if not isinstance(values, dict):
        raise knobs.refused("expected_gpus", values, "define it in group_data/<class>.py", wrong="is not a dict")
    unknown = sorted(set(values) - set(GpuExpectations.__dataclass_fields__))
    missing = sorted(set(GpuExpectations.__dataclass_fields__) - set(values))
    if unknown or missing:
        raise BadHostData(f"expected_gpus has {'unknown keys ' + ', '.join(unknown) if unknown else ''}"
                          f"{' and ' if unknown and missing else ''}{'no ' + ', '.join(missing) if missing else ''}: "
                          f"use exactly {', '.join(GpuExpectations.__dataclass_fields__)}")
    return GpuExpectations(
        name_patterns=tuple(values["name_patterns"]),
        count=knobs.integer("expected_gpus count", values["count"], minimum=1),
        min_memory_mib=knobs.integer("expected_gpus min_memory_mib", values["min_memory_mib"]),
        compute_capability=knobs.matching("expected_gpus compute_capability", str(values["compute_capability"]),
                                          re.compile(r"\d+\.\d+"), "major.minor, e.g. 12.0"),
        interconnect=knobs.matching("expected_gpus interconnect", values["interconnect"],
                                    re.compile(r"(nvlink|pcie)"), "nvlink or pcie"),
        driver_min=knobs.integer("expected_gpus driver_min", values["driver_min"], minimum=1),
        open_kernel_module=knobs.boolean("expected_gpus open_kernel_module", values["open_kernel_module"]),
        fabric_manager=knobs.boolean("expected_gpus fabric_manager", values["fabric_manager"]),
        allreduce_floor_gbps=knobs.integer("expected_gpus allreduce_floor_gbps", values["allreduce_floor_gbps"],
                                           minimum=1),
        p2p_floor_gbps=None if values["p2p_floor_gbps"] is None else knobs.integer(
            "expected_gpus p2p_floor_gbps", values["p2p_floor_gbps"], minimum=1),
    )


def repo_url(data: Any) -> str:
    """NVIDIA's repository URL: https, unless `allow_http_nvidia_repo` trusts a plain-HTTP one (whose
    keyring anyone on the path could swap, and with it every package apt then accepts)."""
    url = schema.value(data, "nvidia_repo_url")
    if url is None:
        raise knobs.refused("nvidia_repo_url", None, "use NVIDIA's https://developer.download.nvidia.com/compute/"
                            "cuda/repos or a mirror's https URL")
    return url


def resolve(data: Any, host_class: str) -> GpuRuntime:
    """The GPU runtime of a host of `host_class` from its data; a bad value raises BadHostData."""
    return GpuRuntime(
        host_class=host_class,
        expected=expected_gpus(data.expected_gpus),
        install_driver=schema.value(data, "install_driver"),
        driver_branch=str(schema.value(data, "driver_branch")),
        nvidia_repo_url=repo_url(data),
    )


SMOKE_RECORD = "gpu-smoke.json"  # in the install directory: the GPU smoke test's result (operations/gpu/smoke.py)


@dataclass(frozen=True)
class SmokeTest:
    """The GPU smoke test of one host: its GPUs' floors, the SGLang build and environment it runs with,
    and the user it runs as."""

    expected: GpuExpectations  # the bus bandwidth floor, and the P2P floor of a PCIe class
    venv: str  # the SGLang virtualenv: its torch and NCCL
    install_dir: str  # where gpu_smoke.py is and its record goes
    env: dict[str, str]  # the unit's environment (NCCL's settings)
    build: str  # the SGLang requirement: a new build is tested again
    user: str | None  # the service user it runs as; None: the deploy's own user (a capture on a GPU host)
    timeout_s: int = 180  # for the all-reduce, start-up included; the P2P attempt gets a third of it

    @property
    def record_path(self) -> str:
        return f"{self.install_dir}/{SMOKE_RECORD}"
