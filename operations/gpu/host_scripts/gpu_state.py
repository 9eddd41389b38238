"""Runs ON THE HOST (imported by host_state.py): the answers to the GPU facts (operations/gpu/facts.py
and packages.py), each the lines that fact's own command prints.

One nvidia-smi run per kind of output (--query-gpu, topo -m, -q), shared by every GPU fact and run
side by side; one dpkg-query for the NVIDIA packages; the fabric units' states from the run's one
`systemctl show` (host_facts.unit_states).
"""

import fnmatch
import functools
import os
import re
import shutil

from host_facts import UNITS_READ, lines_of, read_lines, run, unit_states

GPU_QUERY = ("--query-gpu=index,name,memory.total,compute_cap,driver_version,persistence_mode,mig.mode.current",
             "--format=csv,noheader,nounits")
FABRIC_PACKAGES = ("nvidia-fabricmanager*", "nvlsm")
NVIDIA_PACKAGES = ("nvidia-*", "libnvidia-*", "nvlsm", "cuda-keyring", "linux-headers-*")
FABRIC_UNITS = ("nvidia-fabricmanager", "nvidia-persistenced")
NVSWITCH_DIR = "/proc/driver/nvidia-nvswitch/devices"


EXIT_MARK = "@@nvidia-smi exit "  # NvidiaGpus' line after the query's output (operations/gpu/facts.py)


@functools.cache
def smi() -> dict[str, list[str]]:
    """nvidia-smi's three outputs, run side by side (nothing without nvidia-smi), and the query's exit code
    ("query_exit": the line NvidiaGpus' command prints after it)."""
    binary = shutil.which("nvidia-smi")
    runs = {kind: run([binary, *argv]) if binary else None
            for kind, argv in (("query", GPU_QUERY), ("topo", ("topo", "-m")), ("q", ("-q",)))}
    outputs = {kind: lines_of(process) for kind, process in runs.items()}
    outputs["query_exit"] = [f"{EXIT_MARK}{runs['query'].returncode}"] if runs["query"] else []
    return outputs


@functools.cache
def packages() -> list[tuple[str, ...]]:
    if not shutil.which("dpkg-query"):
        return []
    output = lines_of(run(["dpkg-query", "-W", "-f=${db:Status-Abbrev}|${db:Status-Status}|${Package}|${Version}\\n",
                           *sorted(set(FABRIC_PACKAGES + NVIDIA_PACKAGES))], merge_stderr=False))
    return [tuple(line.split("|", 3)) for line in output if line.count("|") >= 3]


def gpus(args: dict) -> list[str]:
    return smi()["query"] + smi()["query_exit"]


def topology(args: dict) -> list[str]:
    return smi()["topo"]


def driver(args: dict) -> list[str]:
    return read_lines("/proc/driver/nvidia/version") + smi()["q"]


def reboot_pending(args: dict) -> list[str]:
    # nvidia-smi fails every query alike when driver and library differ: the query's output says so.
    return ((["/var/run/reboot-required exists"] if os.path.exists("/var/run/reboot-required") else [])
            + [line.strip() for line in smi()["query"] if "version mismatch" in line.lower()])


def nvidia_fabric(nvswitch_dir: str, unit_states: dict, installed: list[tuple[str, ...]],
                  q_lines: list[str]) -> list[str]:
    """NvidiaFabric's lines, from the unit states, the packages and `nvidia-smi -q`."""
    lines = ["nvswitch: present" if os.path.isdir(nvswitch_dir) and os.listdir(nvswitch_dir) else "nvswitch: absent"]
    for unit in FABRIC_UNITS:
        state = unit_states.get(unit, {})
        lines.append(f"unit: {unit} enabled={state.get('UnitFileState', '')} active={state.get('ActiveState', '')}")
    if os.path.isdir("/sys/module/ib_umad"):
        lines.append("ib_umad: loaded")
    lines += [f"package: {name} {version} {status}" for _, status, name, version in installed
              if any(fnmatch.fnmatchcase(name, pattern) for pattern in FABRIC_PACKAGES)]
    # The awk filter of NvidiaFabric's command: GPU headers and each GPU's Fabric section.
    fabric = False
    for line in q_lines:
        if line.startswith("GPU "):
            lines.append(line)
        elif line == "    Fabric":
            fabric = True
            lines.append(line)
        elif fabric and re.match(r"^        [A-Za-z]", line):
            lines.append(line)
        else:
            fabric = False
    return lines


def fabric(args: dict) -> list[str]:
    return nvidia_fabric(NVSWITCH_DIR, unit_states("gpu_state.fabric", args), packages(), smi()["q"])


UNITS_READ["gpu_state.fabric"] = lambda args: FABRIC_UNITS


def nvidia_packages(args: dict) -> list[str]:
    return [f"{abbrev} {name} {version}" for abbrev, _, name, version in packages()]


def smoke_record(args: dict) -> list[str]:
    return read_lines("/proc/sys/kernel/random/boot_id") + read_lines(args["path"])
