"""Pure parsers for nvidia-smi and /proc/driver/nvidia output (no pyinfra import here).

Each parser takes the text as a list of lines, exactly as a pyinfra fact receives it, and
tolerates what real captures hold: ANSI escapes, tabs or runs of spaces, glued cells,
missing columns, units in values, truncated names.
"""

from __future__ import annotations

import csv
import re
import xml.etree.ElementTree as ET

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


def _value(text: str, kind):
    text = text.strip()
    if text in NOT_A_VALUE:
        return None
    if kind is int:
        # "143771 MiB" without nounits; some fields print "[MiB]" in the header only.
        return int(text.split()[0])
    return text


# A header cell of --format=csv: a field name, with its unit in brackets unless nounits
# ('index', 'memory.total [MiB]'); values never look like this (names, numbers, 'Enabled', 'GPU-...').
HEADER_CELL = re.compile(r"^[a-z][a-z0-9_]*(\.[a-z0-9_]+)*( \[[^\]]*\])?$")


def parse_query_csv(lines: list[str], fields: list[str] | None = None) -> list[dict]:
    """Parse `nvidia-smi --query-gpu=... --format=csv[,noheader][,nounits]`.

    Without `fields` the header line names them (`index, name, memory.total [MiB]`), in any
    field order; a capture without it (`noheader`) starts with a GPU's row, whose fields are
    then told by what their values look like (:func:`fields_by_values`). Unknown fields keep
    their nvidia-smi name. Lines that are not CSV rows of the right width (an NVML error
    message) are skipped.
    """
    rows = [[cell.strip() for cell in row] for row in csv.reader(line for line in lines if line.strip())]
    if fields is None:
        if not rows:
            return []
        if all(HEADER_CELL.match(cell) for cell in rows[0]):
            fields = [re.sub(r"\s*\[.*\]$", "", name) for name in rows[0]]
            rows = rows[1:]
        else:
            fields = fields_by_values([row for row in rows if len(row) == len(rows[0])])
    gpus = []
    for row in rows:
        if len(row) != len(fields):
            continue
        gpu = {}
        for field, text in zip(fields, row):
            key, kind = QUERY_FIELDS.get(field, (field, str))
            try:
                gpu[key] = _value(text, kind)
            except ValueError:
                break  # not a data row: an error line that happens to hold commas
        else:
            gpus.append(gpu)
    return gpus


# What a --query-gpu value looks like, per field, for a capture without its header row. Only
# fields whose values cannot be taken for another's: Enabled/Disabled (persistence mode, MIG
# mode) and bare numbers other than memory are left unnamed.
VALUE_SHAPES = [
    ("uuid", re.compile(r"^GPU-[0-9a-fA-F-]+$")),
    ("pci.bus_id", re.compile(r"^[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7]$")),
    ("driver_version", re.compile(r"^\d{3}\.\d+(\.\d+)?$")),  # 580.159.04, 550.54
    ("compute_cap", re.compile(r"^\d{1,2}\.\d$")),  # 9.0, 12.0
    ("name", re.compile(r"^(NVIDIA|Tesla|Quadro|GeForce)\b.*[A-Za-z]")),
]
MIB = re.compile(r"^(\d+)( MiB)?$")


def fields_by_values(rows: list[list[str]]) -> list[str]:
    """The --query-gpu fields of header-less rows, told by their values: a column every row of
    which has one field's shape is that field (the first such column); the column of the
    largest MiB figures is memory.total (memory.used and .free never exceed it); 0..N-1 down
    the rows is index. Other columns keep a name no reader uses ('column N')."""
    columns = list(zip(*rows))
    fields = [f"column {number}" for number in range(len(columns))]

    def shaped(pattern, values):
        return all(pattern.match(value) for value in values)

    for field, pattern in VALUE_SHAPES:
        found = next((i for i, values in enumerate(columns) if fields[i].startswith("column ")
                      and shaped(pattern, values)), None)
        if found is not None:
            fields[found] = field
    free = [i for i in range(len(columns)) if fields[i].startswith("column ")]
    indexes = [i for i in free if list(columns[i]) == [str(n) for n in range(len(rows))]]
    if indexes:
        fields[indexes[0]] = "index"
    # With units every memory figure says MiB; without (nounits) a GPU's memory is above 1024 MiB.
    memories = [i for i in free if i not in indexes[:1] and shaped(MIB, columns[i])
                and (all(value.endswith(" MiB") for value in columns[i])
                     or all(int(MIB.match(value).group(1)) > 1024 for value in columns[i]))]
    if memories:
        fields[max(memories, key=lambda i: max(int(MIB.match(v).group(1)) for v in columns[i]))] = "memory.total"
    return fields


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
    ("FB Memory Usage", "Total"): "memory_total_mib",
    ("Persistence Mode",): "persistence_mode",
    ("MIG Mode", "Current"): "mig_mode",
    ("Fabric", "State"): "fabric_state",
    ("Fabric", "Status"): "fabric_status",
}


def parse_smi_q(lines: list[str]) -> dict:
    """Parse `nvidia-smi -q` text (whole, or filtered to some sections).

    Returns ``{"driver_version": "580.159.04", "cuda_version": "13.0", "gpus": [{"pci_bus_id":
    "00000000:00:06.0", "name": "NVIDIA H200", "memory_total_mib": 143771, "persistence_mode":
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
            gpu[target] = _value(value, int if target == "memory_total_mib" else str)
    return result


def parse_smi_xml(text: str) -> dict:
    """Parse `nvidia-smi -q -x` into the same shape as :func:`parse_smi_q`."""
    root = ET.fromstring(text)

    def text_of(node, path):
        found = node.find(path)
        return _value(found.text or "", str) if found is not None else None

    gpus = []
    for node in root.findall("gpu"):
        memory = text_of(node, "fb_memory_usage/total")
        gpus.append(
            dict(
                pci_bus_id=node.get("id"),
                name=text_of(node, "product_name"),
                memory_total_mib=_value(memory, int) if memory else None,
                persistence_mode=text_of(node, "persistence_mode"),
                mig_mode=text_of(node, "mig_mode/current_mig"),
                fabric_state=text_of(node, "fabric/state"),
                fabric_status=text_of(node, "fabric/status"),
            )
        )
    return dict(
        driver_version=text_of(root, "driver_version"),
        cuda_version=text_of(root, "cuda_version"),
        gpus=gpus,
    )


# 'Driver Version: 580.159.04   CUDA Version: 13.0'; from R610 'KMD Version: 610.57.04
# CUDA UMD Version: 13.3' (a published 610.57.04 table, noonghunna/club-3090#1229).
SMI_TABLE_HEADER = re.compile(r"(?:Driver|KMD) Version:\s*(\S+)\s+CUDA (?:UMD )?Version:\s*(\S+)")
SMI_TABLE_GPU = re.compile(r"^\|\s+(\d+)\s+(.+?)\s+(On|Off)\s+\|")
SMI_TABLE_MEMORY = re.compile(r"/\s*(\d+)MiB")
# The third line of a GPU's block: its MIG mode in the last column ('MIG M.').
SMI_TABLE_MIG = re.compile(r"^\|\s+\|\s+\|\s+(Enabled|Disabled|N/A)\s+\|$")
# Tables after the GPUs' own: per MIG instance (its slice's memory, not the card's) and processes.
SMI_TABLE_END = re.compile(r"^\|\s*(MIG devices|Processes):")


def parse_smi_table(lines: list[str]) -> dict:
    """Parse the plain `nvidia-smi` table: driver, CUDA version, and per GPU index, memory and MIG mode.

    The table truncates long names ('NVIDIA RTX PRO 6000 Blac...'): a truncated name is
    None, so that no one takes it for the real one. Only the GPUs' table is read: with MIG
    enabled a 'MIG devices' table follows, whose memory column is each instance's slice
    (`14366MiB / 19968MiB` on an 80 GB card, XuehaiPan/nvitop#8), not the card's.
    """
    result: dict = dict(driver_version=None, cuda_version=None, gpus=[])
    for line in lines:
        line = ANSI_ESCAPE.sub("", line).rstrip()
        if SMI_TABLE_END.match(line):
            break
        if header := SMI_TABLE_HEADER.search(line):
            result["driver_version"], result["cuda_version"] = header.groups()
        elif row := SMI_TABLE_GPU.match(line):
            name = row.group(2)
            result["gpus"].append(
                dict(index=int(row.group(1)), name=None if name.endswith("...") else name,
                     persistence_mode="Enabled" if row.group(3) == "On" else "Disabled")
            )
        elif (mig := SMI_TABLE_MIG.match(line)) and result["gpus"]:
            result["gpus"][-1]["mig_mode"] = _value(mig.group(1), str)
        elif (memory := SMI_TABLE_MEMORY.search(line)) and result["gpus"]:
            result["gpus"][-1].setdefault("memory_total_mib", int(memory.group(1)))
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
