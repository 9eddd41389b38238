"""Tell a host's class from captured nvidia-smi outputs in a folder (no pyinfra needed).

Used by `python -m operations.gpu classify DIR` and by the tests that replay real captures.
"""

from __future__ import annotations

import runpy
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

from .parse import parse_query_csv, parse_smi_q, parse_smi_table, parse_smi_xml, parse_topology
from .products import interconnect_by_product, named

GROUP_DATA_DIR = Path(__file__).resolve().parents[2] / "group_data"

# File name in a capture folder -> how to read it into {"driver_version", "cuda_version", "gpus"}.
CAPTURE_READERS = {
    "query.csv": lambda text: dict(gpus=parse_query_csv(text.splitlines())),
    "smi_q.txt": lambda text: parse_smi_q(text.splitlines()),
    "q.txt": lambda text: parse_smi_q(text.splitlines()),
    "q.xml": parse_smi_xml,
    # Last: the plain table truncates long names, so it only fills what nothing else gave.
    "smi.txt": lambda text: parse_smi_table(text.splitlines()),
}


def load_class_expectations(group_data_dir: Path = GROUP_DATA_DIR) -> dict[str, dict]:
    """Return {class name: its `expected_gpus`} for every group_data file defining one."""
    classes = {}
    for path in sorted(group_data_dir.glob("*.py")):
        if path.stem == "all":  # pyinfra's data for every host, not a class
            continue
        gpu = runpy.run_path(str(path)).get("expected_gpus")
        if isinstance(gpu, dict):
            classes[path.stem] = gpu
    return classes


def host_class_for(gpu_name: str | None, interconnect: str | None, classes: dict[str, dict]) -> str:
    """The class whose name pattern matches and whose interconnect is the host's, else 'unknown'."""
    for class_name, expected in classes.items():
        if (
            gpu_name
            and interconnect == expected["interconnect"]
            and named(gpu_name, expected["name_patterns"])
        ):
            return class_name
    return "unknown"


def classify_dir(capture_dir: Path, classes: dict[str, dict] | None = None) -> dict:
    """Summarize the captures in `capture_dir`; a field no file tells is None. With topo.txt,
    interconnect is what its GPU pairs read ('unknown' when mixed or there is no pair);
    without it, the GPUs' product may tell (operations/gpu/products.py: cards that have no
    NVLink are 'pcie', and not degraded), else interconnect and degraded are None.

    Raises FileNotFoundError when the folder holds no readable capture.
    """
    readings = []
    for file_name, read in CAPTURE_READERS.items():
        try:
            readings.append(read((capture_dir / file_name).read_text(errors="replace")))
        except (OSError, ET.ParseError):
            continue  # absent or unreadable: the other files may still tell
    try:
        topology = parse_topology((capture_dir / "topo.txt").read_text(errors="replace").splitlines())
    except OSError:
        topology = None
    if not readings and topology is None:
        raise FileNotFoundError(
            f"{capture_dir}: no readable capture (expected one of topo.txt, {', '.join(CAPTURE_READERS)})"
        )

    def per_gpu(key):
        # The first source whose GPUs all tell `key`: sources are in order of trust.
        for reading in readings:
            values = [gpu.get(key) for gpu in reading.get("gpus", [])]
            if values and all(value is not None for value in values):
                return values
        return []

    def most_common(values):
        return Counter(values).most_common(1)[0][0] if values else None

    names = per_gpu("name")
    memories = per_gpu("memory_total_mib")
    driver_versions = per_gpu("driver_version") + [reading.get("driver_version") for reading in readings]
    counts = [len(reading["gpus"]) for reading in readings if reading.get("gpus")]
    if not counts and topology and topology["gpus"]:
        counts = [len(topology["gpus"])]
    by_product = interconnect_by_product(names)  # only where no topology was read
    result = dict(
        gpu_name=most_common(names),
        gpu_count=counts[0] if counts else None,
        memory_total_mib=min(memories) if memories else None,
        driver_version=next((version for version in driver_versions if version), None),
        compute_capability=most_common(per_gpu("compute_capability")),
        interconnect=topology["interconnect"] if topology else by_product,
        degraded=topology["degraded"] if topology else (False if by_product else None),
    )
    classes = load_class_expectations() if classes is None else classes
    result["host_class"] = host_class_for(result["gpu_name"], result["interconnect"], classes)
    return result
