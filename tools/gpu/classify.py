"""Tell a host's class from captured nvidia-smi outputs in a folder (no pyinfra needed).

Used by `python -m tools.gpu classify DIR` and by the tests that replay real captures.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

from deployment import site_data
from deployment.gpu.products import interconnect_by_product, named
from operations.gpu.parse import parse_smi_q, parse_topology, smi_failure

from .smi_captures import parse_query_csv, parse_smi_table, parse_smi_xml

# File name in a capture folder -> how to read it into {"driver_version", "cuda_version", "gpus"}.
CAPTURE_READERS = {
    "query.csv": lambda text: dict(gpus=parse_query_csv(text.splitlines())),
    "smi_q.txt": lambda text: parse_smi_q(text.splitlines()),
    "q.txt": lambda text: parse_smi_q(text.splitlines()),
    "q.xml": parse_smi_xml,
    # Last: the plain table truncates long names, so it only fills what nothing else gave.
    "smi.txt": lambda text: parse_smi_table(text.splitlines()),
}


def load_class_expectations() -> dict[str, dict]:
    """Return {class name: its `expected_gpus`} for every host class (site_data.host_classes: the product's and
    the site's)."""
    return {name: site_data.class_file_values(name)["expected_gpus"] for name in site_data.host_classes()}


def host_class_for(gpu_names: list[str], interconnect: str | None, classes: dict[str, dict]) -> str:
    """The class whose name pattern every GPU's name matches, whose GPU count and interconnect are the
    host's, else 'unknown' (also for a host of two GPU models: no class serves from a mix; and for a part of
    a class's board, such as 2 of an HGX's 8 GPUs lent as one machine: preflight would refuse its count)."""
    if len(set(gpu_names)) != 1:
        return "unknown"
    for class_name, expected in classes.items():
        if interconnect == expected["interconnect"] and len(gpu_names) == expected["count"] \
                and named(gpu_names[0], expected["name_patterns"]):
            return class_name
    return "unknown"


# The fields a failing nvidia-smi leaves unknown (its words say why: `nvidia_smi_failed`).
GPU_FIELDS = ("gpu_name", "gpu_models", "gpu_count", "memory_total_mib", "driver_version", "compute_capability",
              "mig_mode", "interconnect", "degraded")


def classify_dir(capture_dir: Path, classes: dict[str, dict] | None = None) -> dict:
    """Summarize the captures in `capture_dir`; a field no file tells is None. With topo.txt,
    interconnect is what its GPU pairs read ('unknown' when mixed or there is no pair);
    without it, the GPUs' product may tell (deployment/gpu/products.py: cards that have no
    NVLink are 'pcie', and not degraded), else interconnect and degraded are None.

    Every GPU counts: `gpu_models` lists each model with how many cards (a host of two models
    has no single `gpu_name`: 'mixed', and no class); `mig_mode` is 'Enabled' when any card has
    MIG on. Where the captures hold nvidia-smi's failure (no driver, NVML not initialised) and no
    GPU, the GPU fields are 'unknown' and `nvidia_smi_failed` says why and what to do.

    Raises FileNotFoundError when the folder holds no readable capture.
    """
    readings, failures = [], []
    for file_name, read in CAPTURE_READERS.items():
        try:
            text = (capture_dir / file_name).read_text(errors="replace")
        except OSError:
            continue  # absent or unreadable: the other files may still tell
        if failure := smi_failure(text.splitlines()):
            failures.append(failure)
            continue
        try:
            readings.append(read(text))
        except ET.ParseError:
            continue
    try:
        topology_text = (capture_dir / "topo.txt").read_text(errors="replace").splitlines()
    except OSError:
        topology_text = None
    if topology_text is not None and (failure := smi_failure(topology_text)):
        failures.append(failure)
        topology_text = None
    topology = parse_topology(topology_text) if topology_text is not None else None
    if not readings and topology is None and not failures:
        raise FileNotFoundError(
            f"{capture_dir}: no readable capture (expected one of topo.txt, {', '.join(CAPTURE_READERS)})"
        )
    classes = load_class_expectations() if classes is None else classes
    if failures and not any(reading.get("gpus") for reading in readings):
        return dict({field: "unknown" for field in GPU_FIELDS}, host_class="unknown", nvidia_smi_failed=failures[0])

    def per_gpu(key):
        # The first source whose GPUs all tell `key`: sources are in order of trust.
        for reading in readings:
            values = [gpu.get(key) for gpu in reading.get("gpus", [])]
            if values and all(value is not None for value in values):
                return values
        return []

    def one_or_mixed(values):
        return (values[0] if len(set(values)) == 1 else "mixed") if values else None

    names = per_gpu("name")
    models = [dict(name=name, count=count) for name, count in Counter(names).items()]
    memories = per_gpu("memory_total_mib")
    mig_modes = per_gpu("mig_mode")
    driver_versions = per_gpu("driver_version") + [reading.get("driver_version") for reading in readings]
    counts = [len(reading["gpus"]) for reading in readings if reading.get("gpus")]
    if not counts and topology and topology["gpus"]:
        counts = [len(topology["gpus"])]
    by_product = interconnect_by_product(names)  # only where no topology was read
    result = dict(
        gpu_name=one_or_mixed(names),
        gpu_models=models or None,
        gpu_count=counts[0] if counts else None,
        memory_total_mib=min(memories) if memories else None,
        driver_version=next((version for version in driver_versions if version), None),
        compute_capability=one_or_mixed(per_gpu("compute_capability")),
        mig_mode=("Enabled" if "Enabled" in mig_modes else mig_modes[0]) if mig_modes else None,
        interconnect=topology["interconnect"] if topology else by_product,
        degraded=topology["degraded"] if topology else (False if by_product else None),
    )
    result["host_class"] = host_class_for(names, result["interconnect"], classes)
    return result
