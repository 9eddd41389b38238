"""Host data as pyinfra would merge it for one host, from the real group_data files."""

import runpy
from pathlib import Path
from types import ModuleType, SimpleNamespace

from deployment.gpu.config import GpuExpectations, expected_gpus

REPO = Path(__file__).resolve().parents[2]
GROUP_DATA = REPO / "group_data"
LAB_GROUP_DATA = REPO / "lab" / "group_data"


def _values(path: Path) -> dict:
    """A group data file's values, without what it imports (as pyinfra reads it)."""
    return {key: value for key, value in runpy.run_path(str(path)).items()
            if not key.startswith("__") and not isinstance(value, ModuleType)}


def host_data(host_class: str, lab: bool = False, **overrides) -> SimpleNamespace:
    data = {}
    for path in [GROUP_DATA / "all.py", GROUP_DATA / f"{host_class}.py", *([LAB_GROUP_DATA / "lab.py"] if lab else [])]:
        data.update(_values(path))
    data.update(overrides)
    return SimpleNamespace(**data)


def captured_driver(capture: str = "rtxpro6000se-8x-pcie/smi_q.txt") -> dict:
    """NvidiaDriver read from a real `nvidia-smi -q` in tests/fixtures/nvidia-smi (the 8x RTX PRO 6000's by default,
    whose GPU at index 0 is /dev/nvidia2)."""
    from operations.gpu.facts import NvidiaDriver
    return NvidiaDriver().process((REPO / "tests" / "fixtures" / "nvidia-smi" / capture).read_text().splitlines())


# The 8x RTX PRO 6000's minor numbers, index by index: [2, 3, 0, 1, 6, 7, 4, 5].
RTX_MINORS = tuple(captured_driver()["gpu_minor_numbers"])


def class_expectations(host_class: str) -> GpuExpectations:
    """What group_data/<host_class>.py expects of the GPUs."""
    return expected_gpus(_values(GROUP_DATA / f"{host_class}.py")["expected_gpus"])
