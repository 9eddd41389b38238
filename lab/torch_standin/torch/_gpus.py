# LAB STAND-IN, NOT NCCL (see torch/__init__.py).
"""The host's GPUs as the lab's nvidia-smi stand-in describes them (its GPU profile, loaded from the
nvidia-smi on the PATH), and what NCCL makes of them.

CUDA fails where it would on those GPUs: no driver loaded, the NVML library of another version
than the loaded module (a driver upgraded without a reboot), and error 802 "system not yet
initialized" on an NVSwitch profile while fabric registration is not Completed.

Which transport NCCL takes, as its ncclTopoCheckP2p decides (NVIDIA/nccl src/graph/paths.cc): a
pair of GPUs talks P2P when its path (the profile's topo.txt: NV# is NVL, NODE is NCCL's PHB) is
no longer than the P2P level, else through host memory (SHM). The level is the user's when set:
NCCL_P2P_DISABLE=1 is LOC (never); else NCCL_P2P_LEVEL, a name (LOC NVL NVB PIX PXB PHB SYS) or
the legacy number (0 LOC, 1 PIX, 2 PXB, 3 PHB, 4 and above SYS); a value it cannot read counts
as unset. Unset, NCCL uses P2P on every path ("use P2P whenever we can": SYS), except through
Intel or ARM CPUs (PXB); the profile's `allreduce.cpu_vendor` says which.

The ring runs GPU 0, 1, ..., N-1 and back to 0. With every hop P2P the profile's
`allreduce.p2p` figures apply, otherwise its `allreduce.no_p2p` ones (the slowest hop sets a
ring's pace). Figures are bus bandwidth by message size; an all-reduce of B bytes on N GPUs takes
B / (busbw / (2(N-1)/N)) seconds. A profile whose P2P hangs (`allreduce.p2p.hang`,
NVIDIA/nccl#1999: both ranks finish init, the first collective never completes, no error) never
completes a collective while any hop is P2P.
"""

import contextlib
import functools
import importlib.util
import io
import os
import re
import shutil
from importlib.machinery import SourceFileLoader

# NCCL's path types, shortest first (src/graph/topo.h).
PATH_TYPES = ["LOC", "NVL", "NVB", "C2C", "PIX", "PXB", "PXN", "P2C", "PHB", "SYS"]
LEGACY_LEVELS = ["LOC", "PIX", "PXB", "PHB", "SYS", "SYS"]  # paths.cc levelsOldToNew
# nvidia-smi topo -m's words as NCCL's path types.
TOPO_TO_PATH = {"X": "LOC", "PIX": "PIX", "PXB": "PXB", "PHB": "PHB", "NODE": "PHB", "SYS": "SYS"}
# What CUDA says where the nvidia-smi stand-in fails (its exit code): torch's words for cuInit's errors.
CUDA_ERRORS = {
    9: "Found no NVIDIA driver on your system. Please check that you have an NVIDIA GPU and installed a driver "
       "from http://www.nvidia.com/Download/index.aspx",
    18: "CUDA error: system has unsupported display driver / cuda driver combination",
}


def _nvidia_smi():
    path = shutil.which("nvidia-smi")
    if path is None:
        raise RuntimeError(CUDA_ERRORS[9])
    loader = SourceFileLoader("nvidia_smi_standin", path)
    module = importlib.util.module_from_spec(importlib.util.spec_from_loader(loader.name, loader))
    loader.exec_module(module)
    return module


@functools.cache
def profile() -> dict:
    """The host's GPU profile with its state (nvidia-smi stand-in's load_profile), or CUDA's error."""
    smi = _nvidia_smi()
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            return smi.load_profile()
    except SystemExit as stop:  # the stand-in answers as nvidia-smi would: its exit code says why
        raise RuntimeError(CUDA_ERRORS.get(stop.code, f"CUDA error: unknown error (nvidia-smi exit {stop.code})"))


def cuda_init() -> None:
    if any(gpu.get("fabric_state") not in (None, "Completed") for gpu in profile()["gpus"]):
        raise RuntimeError("CUDA error: system not yet initialized (CUDA error 802: the NVSwitch fabric "
                           "registration is not Completed)")


def _strtol(text: str) -> int:
    digits = re.match(r"\s*[+-]?\d+", text)
    return int(digits.group()) if digits else 0


def user_p2p_level(env=os.environ) -> str | None:
    """ncclGetLevel(NCCL_P2P_DISABLE, NCCL_P2P_LEVEL): a path type, or None when unset."""
    disable = env.get("NCCL_P2P_DISABLE")
    if disable is not None and _strtol(disable) == 1:
        return "LOC"
    level = env.get("NCCL_P2P_LEVEL")
    if level is None:
        return None
    if level in PATH_TYPES:
        return level
    if level[:1].isdigit():
        return LEGACY_LEVELS[min(_strtol(level), len(LEGACY_LEVELS) - 1)]
    return None


def topology_paths(found: dict) -> dict:
    """{(i, j): NCCL path type} between the profile's GPUs, from its topo.txt."""
    with open(os.path.join(found["dir"], "topo.txt")) as handle:
        rows = [line.split("\t") for line in handle.read().split("\n") if re.match(r"GPU\d+\t", line)]
    paths = {}
    for i, cells in enumerate(rows):
        for j in range(len(rows)):
            cell = cells[1 + j].strip()
            paths[i, j] = "NVL" if cell.startswith("NV") else TOPO_TO_PATH[cell]
    return paths


def ring(world_size: int, env=os.environ) -> dict:
    """What NCCL makes of the ring over `world_size` GPUs: its P2P level, each hop's transport, the figures
    that apply, and whether it hangs."""
    found = profile()
    allreduce = found["allreduce"]
    default = "PXB" if allreduce.get("cpu_vendor") in ("Intel", "ARM") else "SYS"
    level = user_p2p_level(env) or default
    paths = topology_paths(found)
    hops = [paths[i, (i + 1) % world_size] for i in range(world_size)]
    p2p = [PATH_TYPES.index(path) <= PATH_TYPES.index(level) for path in hops]
    figures = allreduce["p2p"] if all(p2p) else allreduce["no_p2p"]
    return dict(level=level, hops=hops, p2p=p2p, hangs=any(p2p) and bool(allreduce["p2p"].get("hang")),
                busbw_gbps={int(size): value for size, value in figures.get("busbw_gbps", {}).items()},
                source=figures["source"])


def seconds(ring_: dict, nbytes: int, world_size: int) -> float:
    """How long NCCL's all-reduce of `nbytes` takes on the ring: the profile's bus bandwidth at the largest
    measured size not above it (nothing below the smallest: latency-bound, the stand-in adds no time)."""
    sizes = [size for size in sorted(ring_["busbw_gbps"]) if size <= nbytes]
    if not sizes or world_size < 2:
        return 0.0
    busbw = ring_["busbw_gbps"][sizes[-1]]
    return nbytes / (busbw * 1e9 / (2 * (world_size - 1) / world_size))
