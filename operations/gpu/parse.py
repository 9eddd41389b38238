"""Pure parsers for nvidia-smi and /proc/driver/nvidia output (no pyinfra import here).

Each parser takes the text as a list of lines, exactly as a pyinfra fact receives it, and
tolerates what real captures hold: ANSI escapes, tabs or runs of spaces, glued cells,
missing columns, units in values, truncated names.
"""

from __future__ import annotations

import csv
import re

ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")

# nvidia-smi --query-gpu field -> key in our GPU dicts, and how to read its value.
QUERY_FIELDS = {
    "index": ("index", int),
    "name": ("name", str),
    "memory.total": ("memory_total_mib", int),
    "compute_cap": ("compute_capability", str),
    "driver_version": ("driver_version", str),
    "persistence_mode": ("persistence_mode", str),
    "mig.mode.current": ("mig_mode", str),
    "pci.bus_id": ("pci_bus_id", str),
    "uuid": ("uuid", str),
}
# nvidia-smi prints these instead of a value when a field does not apply.
NOT_A_VALUE = {"", "[N/A]", "N/A", "[Not Supported]", "Not Supported"}


def field_value(text: str, kind):
    text = text.strip()
    if text in NOT_A_VALUE:
        return None
    if kind is int:
        # "143771 MiB" without nounits; some fields print "[MiB]" in the header only.
        return int(text.split()[0])
    return text


def parse_query_csv(lines: list[str], fields: list[str]) -> list[dict]:
    """Parse `nvidia-smi --query-gpu=FIELDS --format=csv,noheader[,nounits]` (`fields` in the order
    asked). Unknown fields keep their nvidia-smi name. Lines that are not CSV rows of the right
    width (an NVML error message) are skipped.
    """
    rows = [[cell.strip() for cell in row] for row in csv.reader(line for line in lines if line.strip())]
    gpus = []
    for row in rows:
        if len(row) != len(fields):
            continue
        gpu = {}
        for field, text in zip(fields, row):
            key, kind = QUERY_FIELDS.get(field, (field, str))
            try:
                gpu[key] = field_value(text, kind)
            except ValueError:
                break  # not a data row: an error line that happens to hold commas
        else:
            gpus.append(gpu)
    return gpus


# Cells between two devices in `nvidia-smi topo -m`. NV# before the PCIe words; a
# findall splits glued cells such as 'PXBNODE' or 'SYSSYS' as published in real reports.
TOPO_CELL = re.compile(r"NV\d+|PIX|PXB|PHB|NODE|SYS|X")
TOPO_DEVICE = re.compile(r"^(GPU|NIC)(\d+)$")
# A data row: a device label, then cells (the first is X, NV# or a PCIe word, glued or not).
TOPO_ROW = re.compile(r"^\s*((?:GPU|NIC)\d+)\s+((?:NV\d+|PIX|PXB|PHB|NODE|SYS|X)\b.*)$")


def parse_topology(lines: list[str]) -> dict:
    """Parse `nvidia-smi topo -m` into GPU-pair links and the host's interconnect.

    Returns ``{"gpus": [0, 1], "links": {"0-1": "NV18"}, "interconnect": "nvlink",
    "degraded": False, "gpus_without_nvlink": []}``. ``interconnect`` is ``nvlink`` only
    when every GPU pair is NV#, ``pcie`` when none is, else ``unknown`` (also with fewer
    than two GPUs: no pair, nothing to read). ``degraded`` is True when some pairs are
    NVLink and some GPU has no NVLink at all (an NVLink board with a GPU that fell back).

    Columns are read from the header row; pasted without it, the columns follow the row
    labels in order (nvidia-smi prints rows and columns in the same device order).
    """
    clean = [ANSI_ESCAPE.sub("", line).rstrip() for line in lines]
    rows = [match.groups() for line in clean if (match := TOPO_ROW.match(line))]
    header = next((line for line in clean if re.search(r"\bGPU0\b", line) and not TOPO_ROW.match(line)), None)
    # Device columns come first; CPU/NUMA affinity columns follow and are not links.
    columns = ([token for token in header.split() if TOPO_DEVICE.match(token)] if header is not None
               else [label for label, _ in rows])
    cells = {label: dict(zip(columns, TOPO_CELL.findall(rest))) for label, rest in rows if label.startswith("GPU")}
    gpus = sorted(int(TOPO_DEVICE.match(label).group(2)) for label in cells)
    links = {}
    for i, a in enumerate(gpus):
        for b in gpus[i + 1 :]:
            # A row may be short (missing cells): the transposed cell says the same.
            link = cells[f"GPU{a}"].get(f"GPU{b}") or cells[f"GPU{b}"].get(f"GPU{a}")
            links[f"{a}-{b}"] = link
    return _topology(gpus, links)


def _topology(gpus: list[int], links: dict) -> dict:
    nvlink_pairs = {pair for pair, link in links.items() if link and link.startswith("NV")}
    gpus_with_nvlink = {int(gpu) for pair in nvlink_pairs for gpu in pair.split("-")}
    gpus_without_nvlink = [gpu for gpu in gpus if gpu not in gpus_with_nvlink]
    if not links:
        interconnect = "unknown"
    elif len(nvlink_pairs) == len(links):
        interconnect = "nvlink"
    elif not nvlink_pairs:
        interconnect = "pcie"
    else:
        interconnect = "unknown"
    return dict(
        gpus=gpus,
        links=links,
        interconnect=interconnect,
        degraded=bool(nvlink_pairs) and bool(gpus_without_nvlink),
        gpus_without_nvlink=gpus_without_nvlink if nvlink_pairs else [],
    )


def _key_value(line: str) -> tuple[int, str, str | None]:
    """'    Product Name   : NVIDIA H200' -> (4, 'Product Name', 'NVIDIA H200')."""
    indent = len(line) - len(line.lstrip(" "))
    key, sep, value = line.strip().partition(":")
    return indent, key.strip(), value.strip() if sep else None


# `nvidia-smi -q` paths (section, key) -> key in our GPU dicts.
SMI_Q_GPU_KEYS = {
    ("Product Name",): "name",
    ("Minor Number",): "minor_number",  # the N of /dev/nvidiaN, not the index (NVML's nvmlDeviceGetMinorNumber)
    ("FB Memory Usage", "Total"): "memory_total_mib",
    ("Persistence Mode",): "persistence_mode",
    ("MIG Mode", "Current"): "mig_mode",
    ("Fabric", "State"): "fabric_state",
    ("Fabric", "Status"): "fabric_status",
}


def parse_smi_q(lines: list[str]) -> dict:
    """Parse `nvidia-smi -q` text (whole, or filtered to some sections).

    Returns ``{"driver_version": "580.159.04", "cuda_version": "13.0", "gpus": [{"pci_bus_id":
    "00000000:00:06.0", "name": "NVIDIA H200", "minor_number": 0, "memory_total_mib": 143771, "persistence_mode":
    "Enabled", "mig_mode": "Disabled", "fabric_state": "Completed", "fabric_status":
    "Success"}]}``; a value nvidia-smi prints as N/A is None.
    """
    result: dict = dict(driver_version=None, cuda_version=None, gpus=[])
    gpu: dict | None = None
    path: list[tuple[int, str]] = []  # open sections as (indent, name)
    for line in lines:
        line = ANSI_ESCAPE.sub("", line.expandtabs()).rstrip()
        if not line.strip():
            continue
        if line.startswith("GPU "):  # 'GPU 00000000:00:06.0' opens one GPU's block
            gpu = dict(pci_bus_id=line[4:].strip())
            result["gpus"].append(gpu)
            path = []
            continue
        indent, key, value = _key_value(line)
        if indent == 0:
            if key == "Driver Version":
                result["driver_version"] = value
            elif key == "CUDA Version":
                result["cuda_version"] = value
            continue
        while path and path[-1][0] >= indent:
            path.pop()
        if value is None or value == "":
            path.append((indent, key))
            continue
        target = SMI_Q_GPU_KEYS.get(tuple(name for _, name in path) + (key,))
        if gpu is not None and target:
            gpu[target] = field_value(value, int if target in ("memory_total_mib", "minor_number") else str)
    return result


# nvidia-smi's exit codes (its man page, RETURN VALUE: "distinct non zero values for each error
# class"; 17 and 18 are NVML's nvmlReturn_t values it passes on, NVIDIA/go-nvml gen/nvml/nvml.h):
# what each means and what to do. nvidia-smi prints its error on stdout, so its exit code, not
# its output's shape, says whether the output holds GPUs.
SMI_EXIT_CODES = {
    2: ("nvidia-smi refused its arguments", "check the nvidia-smi version: a field may be unknown to it"),
    3: ("the operation is not available on this GPU", "check the GPU model and driver"),
    4: ("this user may not use the NVIDIA devices", "run it as root, or check the modes of /dev/nvidia*"),
    6: ("the driver sees no GPU", "check `lspci -d 10de:` and `dmesg | grep -i nvrm`: a GPU missing from the "
        "bus needs a reseat or an RMA"),
    8: ("a GPU's external power cables are not attached", "attach them"),
    9: ("no NVIDIA driver is loaded", "load it (`modprobe nvidia`; `dmesg | grep -i nvrm` says why it did not "
        "load) or install the driver (open kernel module) and reboot"),
    10: ("the NVIDIA kernel driver found an interrupt problem with a GPU", "check `dmesg | grep -i nvrm`"),
    12: ("the NVML library is missing", "reinstall the NVIDIA driver packages"),
    13: ("the driver does not implement this query", "update the driver"),
    14: ("a GPU's infoROM is corrupted", "check `nvidia-smi -q` and `dmesg`; it needs an RMA"),
    15: ("a GPU fell off the bus or is not accessible", "check `dmesg` for Xid 79 and power-cycle the host; a GPU "
         "that keeps falling off needs a reseat or an RMA"),
    17: ("the operating system or a cgroup blocks the GPU control device", "check the device cgroup and "
         "/dev/nvidiactl"),
    18: ("the NVML library is another version than the loaded kernel module (a driver installed or upgraded "
         "without a reboot)", "reboot the host so the installed driver's module loads"),
    255: ("nvidia-smi failed with an internal error", "check `dmesg | grep -i nvrm` and the driver installation"),
}
# The texts nvidia-smi prints with those codes, for captures that kept its output but not its code:
# 9 and 4 as a real H200 host printed them without a driver / without access to its device nodes,
# 18 as published (anderskm/gputil#55; mozilla/translations#1167: "return code 18 ...
# [nvidia-smi(stdout)] Failed to initialize NVML: Driver/library version mismatch"), 6 as a real H200
# host answered `-i 7` with one GPU.
SMI_FAILURE_TEXTS = [
    (re.compile(r"^NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver"), 9),
    (re.compile(r"^Failed to initialize NVML: Insufficient Permissions"), 4),
    (re.compile(r"^Failed to initialize NVML: Driver/library version mismatch"), 18),
    (re.compile(r"^Failed to initialize NVML: GPU access blocked by the operating system"), 17),
    (re.compile(r"^No devices were found"), 6),
    (re.compile(r"^Failed to initialize NVML: "), 255),
]


def smi_failure(lines: list[str], exit_code: int | None = None) -> dict | None:
    """Why nvidia-smi could not read the GPUs, from its exit code (or, where a capture lost it,
    from the texts it prints with one), or None when it read them.

    ``{"exit_code": 18, "message": "Failed to initialize NVML: Driver/library version mismatch",
    "cause": "the NVML library is another version than ...", "fix": "reboot the host ..."}``
    """
    text = [ANSI_ESCAPE.sub("", line).strip() for line in lines if line.strip()]
    if exit_code is None:
        exit_code = next((code for line in text[:3] for pattern, code in SMI_FAILURE_TEXTS if pattern.match(line)),
                         0)
    if exit_code == 0:
        return None
    cause, fix = SMI_EXIT_CODES.get(exit_code, (f"nvidia-smi failed (exit code {exit_code})",
                                                "check `dmesg | grep -i nvrm` and the driver installation"))
    return dict(exit_code=exit_code, message="; ".join(text[:2]) if text else "(no output)", cause=cause, fix=fix)


NVRM_VERSION = re.compile(r"NVRM version:.*Kernel Module(?: for \S+)?\s+(\d+(?:\.\d+)+)")


def parse_proc_driver_version(lines: list[str]) -> dict | None:
    """Parse /proc/driver/nvidia/version: the loaded kernel module's version and kind.

    'NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.95.05  Release Build ...'
    -> ``{"version": "580.95.05", "open_kernel_module": True}``; proprietary modules read
    'NVIDIA UNIX x86_64 Kernel Module  570.158.01 ...'. None when no NVRM line is there.
    """
    for line in lines:
        if match := NVRM_VERSION.search(line):
            return dict(version=match.group(1), open_kernel_module="Open Kernel Module" in line)
    return None
