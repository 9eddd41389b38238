"""Parsers of what a capture folder holds beyond what the deploy's facts read (no pyinfra import here):
`--query-gpu` CSV with its header or without it, `nvidia-smi -q -x`, the plain `nvidia-smi` table."""

from __future__ import annotations

import csv
import re
import xml.etree.ElementTree as ET

from operations.gpu import parse
from operations.gpu.parse import ANSI_ESCAPE, field_value

# A header cell of --format=csv: a field name, with its unit in brackets unless nounits
# ('index', 'memory.total [MiB]'); values never look like this (names, numbers, 'Enabled', 'GPU-...').
HEADER_CELL = re.compile(r"^[a-z][a-z0-9_]*(\.[a-z0-9_]+)*( \[[^\]]*\])?$")


def parse_query_csv(lines: list[str]) -> list[dict]:
    """Parse `nvidia-smi --query-gpu=... --format=csv[,noheader][,nounits]` as captured: the header line
    names the fields (`index, name, memory.total [MiB]`), in any field order; a capture without it
    (`noheader`) starts with a GPU's row, whose fields are then told by what their values look like
    (:func:`fields_by_values`). The rows are read as the deploy's fact reads them (operations.gpu.parse).
    """
    data = [line for line in lines if line.strip()]
    rows = [[cell.strip() for cell in row] for row in csv.reader(data)]
    if not rows:
        return []
    if all(HEADER_CELL.match(cell) for cell in rows[0]):
        return parse.parse_query_csv(data[1:], [re.sub(r"\s*\[.*\]$", "", name) for name in rows[0]])
    return parse.parse_query_csv(data, fields_by_values([row for row in rows if len(row) == len(rows[0])]))


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


def parse_smi_xml(text: str) -> dict:
    """Parse `nvidia-smi -q -x` into the same shape as :func:`parse_smi_q`."""
    root = ET.fromstring(text)

    def text_of(node, path):
        found = node.find(path)
        return field_value(found.text or "", str) if found is not None else None

    gpus = []
    for node in root.findall("gpu"):
        memory = text_of(node, "fb_memory_usage/total")
        minor = text_of(node, "minor_number")
        gpus.append(
            dict(
                pci_bus_id=node.get("id"),
                name=text_of(node, "product_name"),
                minor_number=field_value(minor, int) if minor else None,
                memory_total_mib=field_value(memory, int) if memory else None,
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
            result["gpus"][-1]["mig_mode"] = field_value(mig.group(1), str)
        elif (memory := SMI_TABLE_MEMORY.search(line)) and result["gpus"]:
            result["gpus"][-1].setdefault("memory_total_mib", int(memory.group(1)))
    return result
