"""Build the nvidia-smi stand-in's GPU profiles from the real captures in tests/fixtures.

    .venv/bin/python lab/gpu_standin/build_profiles.py [OUT_DIR]   # default: lab/gpu_standin/profiles

Reproducible: the same captures give byte-identical profiles (a test checks the committed
ones). Where a profile departs from its capture (a newer driver, a fault), profile.json
says so under "derived"; b300_nvlink has no capture and says "synthesized". The captures are
read with plain text operations here, never with operations.gpu's parsers: the stand-in
answers what the capture holds, so a parser bug cannot hide itself by agreeing with itself.

A profile holds what does not change on a host (GPUs, topology, NVSwitch, driver at boot, the
all-reduce figures of the smoke test's lab stand-in with P2P and without, and whether P2P hangs); persistence mode and fabric registration
are the host's state, which the nvidia-smi stand-in reads from the running daemons.
"""

from __future__ import annotations

import json
import re
import shutil
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CAPTURES = REPO / "tests" / "fixtures" / "nvidia-smi"
SMOKE_CAPTURE = CAPTURES / "h200-x2-smoke"
PROFILES_DIR = Path(__file__).resolve().parent / "profiles"
BUS_ID = re.compile(r"\b[0-9A-F]{8}:[0-9A-F]{2}:[0-9A-F]{2}\.\d\b")
# A card with room for the lab's tiny models' weights but not for a KV cache of the class's context (196,608
# tokens): the deploy's KV plan leaves ~47 MiB a GPU of 1,024 MiB for it, ~43,000 tokens of the
# tiny Kimi K2.6 and its drafter.
SMALL_MEMORY_MIB = 1024
# Two NVSwitch chips on an HGX B200/B300 baseboard: entries the fact only counts.
NVSWITCH_BUS_IDS = ["0000:05:00.0", "0000:06:00.0"]


def zeroed_uuid(index: int) -> str:
    return f"GPU-{index:08d}-0000-0000-0000-{index:012d}"


def gpu_entry(index, name, memory_mib, compute_cap, bus_id):
    return dict(index=index, name=name, memory_total_mib=memory_mib, compute_cap=compute_cap, mig_mode="Disabled",
                pci_bus_id=bus_id, uuid=zeroed_uuid(index))


def captured_gpus(q_text: str) -> list[tuple[str, str, int]]:
    """(bus id, product name, FB memory total MiB) of each GPU block of a real -q capture."""
    blocks = re.split(r"(?m)^GPU (?=[0-9A-F]{8}:)", q_text)[1:]
    return [(block.split()[0], re.search(r"(?m)^    Product Name +: (.+)$", block).group(1).strip(),
             int(re.search(r"(?m)^    FB Memory Usage\n        Total +: (\d+) MiB", block).group(1)))
            for block in blocks]


def allreduce(record_file: str, note: str) -> dict:
    """Figures for the lab's all-reduce stand-in: bus bandwidth by message size from a real run's
    record (tests/fixtures/nvidia-smi/h200-x2-smoke)."""
    record = json.loads(next(line for line in (SMOKE_CAPTURE / record_file).read_text().splitlines()
                             if line.startswith("{")))
    return dict(source=f"tests/fixtures/nvidia-smi/h200-x2-smoke/{record_file} ({note})",
                busbw_gbps={str(result["bytes"]): result["busbw_gbps"] for result in record["results"]})


# A PCIe board's all-reduce with P2P working. Synthesized: no real PCIe P2P run is in
# tests/fixtures. A direct P2P ring writes each hop over one PCIe Gen5 x16 link (~64 GB/s each
# way), where the host-memory path of the same real pair read 27.17 GB/s (p2p-disabled.txt).
PCIE_P2P_FIGURES = dict(
    source="synthesized (no real capture): a P2P ring over PCIe Gen5 x16, above the host-memory path's 27.17",
    busbw_gbps={"1048576": 17.8, "16777216": 37.6, "134217728": 40.9, "536870912": 41.3},
)


def transports(p2p: dict, no_p2p: dict, cpu_vendor: str | None = None) -> dict:
    """What the stand-in answers with P2P on every ring hop, and otherwise; NCCL's default P2P
    level follows the CPU (lab/torch_standin/torch/_gpus.py)."""
    return dict(p2p=p2p, no_p2p=no_p2p, **({"cpu_vendor": cpu_vendor} if cpu_vendor else {}))


def driver_version_file(version: str) -> str:
    return (f"NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  {version}  Release Build  "
            "(specfleet lab stand-in)\nGCC version:  gcc version 12.2.0 (Debian 12.2.0-14+deb12u1) \n")


def zero_identifiers(q_text: str) -> str:
    """Serials, UUIDs and PDIs of the published -q log, zeroed like the other captures."""
    q_text = re.sub(r"(Serial Number\s+: )\S+", r"\g<1>0000000000000", q_text)
    q_text = re.sub(r"(GPU PDI\s+: )\S+", r"\g<1>0x0000000000000000", q_text)
    uuids = iter(range(1000))
    return re.sub(r"(GPU UUID\s+: )\S+", lambda m: m.group(1) + zeroed_uuid(next(uuids)), q_text)


def edit_topology(text: str, drop_gpu: int | None = None, pcie_only_gpu: int | None = None) -> str:
    """Fault variants of a tab-separated topo -m: drop one GPU, or cut one GPU's NVLinks.

    A GPU whose NVLinks are cut reaches GPUs of its NUMA half over NODE, the rest over SYS.
    """
    lines = text.split("\n")
    header = lines[0].split("\t")  # '', 'GPU0', ..., 'NIC0', ..., 'CPU Affinity', ...
    gpu_count = sum(1 for cell in header if re.fullmatch(r"GPU\d+", cell))
    half = gpu_count // 2
    out = []
    for number, line in enumerate(lines):
        cells = line.split("\t")
        is_row = re.fullmatch(r"(GPU|NIC)\d+", cells[0]) is not None
        if drop_gpu is not None and (number == 0 or is_row):
            if cells[0] == f"GPU{drop_gpu}":
                continue
            del cells[header.index(f"GPU{drop_gpu}")]
        if pcie_only_gpu is not None and cells[0].startswith("GPU") and is_row:
            row = int(cells[0][3:])
            for column in range(gpu_count):
                if column != row and pcie_only_gpu in (row, column):
                    cells[1 + column] = "NODE" if (row < half) == (column < half) else "SYS"
        out.append("\t".join(cells))
    return "\n".join(out)


def synthesized_nvlink_topology(gpu_count: int, legend: str) -> str:
    """A GPU-only NV18 grid in the layout of the real H200 capture (ANSI header, tabs)."""
    half = gpu_count // 2
    header = "\t\x1b[4m" + "\t".join(f"GPU{i}" for i in range(gpu_count)) + "\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\x1b[0m"
    rows = []
    for i in range(gpu_count):
        cells = [" X " if i == j else "NV18" for j in range(gpu_count)]
        affinity, numa = ("0-55,112-167", "0") if i < half else ("56-111,168-223", "1")
        rows.append("\t".join([f"GPU{i}", *cells, affinity, numa, "", "N/A"]))
    return "\n".join([header, *rows]) + "\n" + legend


def headed_topology(rows: str, gpu_count: int, nic_count: int, legend: str) -> str:
    """A published `topo -m` pasted without its header row, headed as the real H200 capture is (ANSI, tabs)."""
    columns = [f"GPU{i}" for i in range(gpu_count)] + [f"NIC{i}" for i in range(nic_count)]
    header = "\t\x1b[4m" + "\t".join(columns) + "\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\x1b[0m"
    return header + "\n" + rows.rstrip("\n") + "\n\n" + legend


def profiles() -> dict[str, dict]:
    """{profile name: {relative path: file text}}."""
    b200_capture = CAPTURES / "b200-8x-nvlink"
    rtx_capture = CAPTURES / "rtxpro6000se-8x-pcie"
    h200_topology = (CAPTURES / "h200-x2-nvlink" / "topo.txt").read_text()
    legend = h200_topology[h200_topology.index("\nLegend:") + 1:]
    b200_bus_ids = BUS_ID.findall((b200_capture / "smi.txt").read_text())
    b200_topology = (b200_capture / "topo.txt").read_text()
    b200_topology_tabs = (b200_capture / "topo_normalized.txt").read_text()
    rtx_q = zero_identifiers((rtx_capture / "smi_q.txt").read_text())
    rtx_gpus = [gpu_entry(i, name, memory, "12.0", bus_id) for i, (bus_id, name, memory) in enumerate(captured_gpus(rtx_q))]
    nvlink_figures = allreduce("record.json", "a real 2x H200 NVLink pair's figures, not this board's")
    pcie_figures = allreduce("p2p-disabled.txt", "the same real pair with NCCL_P2P_DISABLE=1: a PCIe/host-memory path")
    nvlink = transports(nvlink_figures, pcie_figures)
    # The capture does not name the CPU: AMD is assumed, so NCCL's default uses P2P on every path.
    pcie = transports(PCIE_P2P_FIGURES, pcie_figures, cpu_vendor="AMD")
    pcie_hang = transports(dict(source="FAULT: the P2P all-reduce never completes (NVIDIA/nccl#1999)", hang=True),
                           pcie_figures, cpu_vendor="AMD")
    at_pcie_speed = transports(pcie_figures, pcie_figures)

    def nvlink_gpus(name, memory_mib, compute_cap, count=8):
        return [gpu_entry(i, name, memory_mib, compute_cap, b200_bus_ids[i]) for i in range(count)]

    def profile(source, driver, cuda, gpus, topology, allreduce, q_text=None, nvswitch=False, **notes):
        described = dict(source=source, **notes, driver_version=driver, cuda_version=cuda, nvswitch=nvswitch,
                         allreduce=allreduce, gpus=gpus)
        files = {
            "profile.json": json.dumps(described, indent=2) + "\n",
            "topo.txt": topology,
            "proc-driver/nvidia/version": driver_version_file(driver),
        }
        if q_text:
            files["q.txt"] = q_text
        for bus_id in nvswitch and NVSWITCH_BUS_IDS or []:
            files[f"proc-driver/nvidia-nvswitch/devices/{bus_id}/information"] = f"PCI bus id: {bus_id}\n"
        return files

    b200 = dict(
        source="tests/fixtures/nvidia-smi/b200-8x-nvlink (real, public issue NVIDIA/nccl-tests#333)",
        nvswitch=True,
    )
    b200_derived = "driver 580.95.05 / CUDA 13.0 instead of the captured 570.158.01 / 12.9, so the deploy's "
    b200_derived += "580+ check passes; compute capability 10.0 from the notes (the capture has none)"
    rtx = dict(source="tests/fixtures/nvidia-smi/rtxpro6000se-8x-pcie (real, public repository)")
    # HGX H100/H200 (NVLink4, NVSwitch): the published 8x H100 topo -m's GPU rows (NV18 everywhere, 12 NICs),
    # headed; the GPUs' names, memory and compute capability from real hosts of each.
    hopper_topology = headed_topology((CAPTURES / "h100-8x-nvlink-topo-rows-only" / "topo.txt").read_text(), 8, 12,
                                      legend)
    hopper_derived = ("driver 580.95.05 / CUDA 13.0 (the lab's repository's, with its fabric manager) instead of "
                      "the real hosts' 580.159.04; topo -m is the published 8x H100 rows with a header row added; "
                      "PCI bus ids of the B200 board's capture")
    return {
        "rtx_pro_6000_pcie": profile(
            **rtx, driver="595.58.03", cuda="13.2", gpus=rtx_gpus, topology=(rtx_capture / "topo.txt").read_text(),
            q_text=rtx_q, capture="tests/fixtures/nvidia-smi/rtxpro6000se-8x-pcie", allreduce=pcie,
            derived="serials/UUIDs zeroed; compute capability 12.0 from the notes (the capture has none); "
            "P2P works (the all-reduce's P2P figures are synthesized)",
        ),
        "rtx_pro_6000_pcie_old_driver": profile(
            **rtx, driver="570.124.06", cuda="12.8", gpus=rtx_gpus, topology=(rtx_capture / "topo.txt").read_text(),
            q_text=rtx_q, allreduce=pcie,
            derived="FAULT: driver 570.124.06 / CUDA 12.8 (below the 580 branch) instead of 595.58.03 / 13.2",
        ),
        "rtx_pro_6000_pcie_p2p_hang": profile(
            **rtx, driver="595.58.03", cuda="13.2", gpus=rtx_gpus, topology=(rtx_capture / "topo.txt").read_text(),
            q_text=rtx_q, allreduce=pcie_hang,
            derived="FAULT: the all-reduce hangs while any hop is P2P, as reported for this card (IOMMU/ACS); "
            "with P2P off it completes at the host-memory path's speed; the rest as rtx_pro_6000_pcie",
        ),
        "rtx_pro_6000_pcie_small_memory": profile(
            **rtx, driver="595.58.03", cuda="13.2", gpus=[dict(gpu, memory_total_mib=SMALL_MEMORY_MIB) for gpu in rtx_gpus],
            topology=(rtx_capture / "topo.txt").read_text(), allreduce=pcie,
            derived=f"FAULT: {SMALL_MEMORY_MIB} MiB a card instead of 97887 (no such SKU; -q synthesized from it): "
            "the lab's tiny Kimi K2.6 fits at TP 8 (~4 MiB a GPU), the KV cache of its class's min_kv_tokens does "
            "not; the rest as rtx_pro_6000_pcie",
        ),
        "b200_nvlink": profile(
            **b200, driver="580.95.05", cuda="13.0", gpus=nvlink_gpus("NVIDIA B200", 183359, "10.0"),
            topology=b200_topology, capture="tests/fixtures/nvidia-smi/b200-8x-nvlink", derived=b200_derived,
            allreduce=nvlink,
        ),
        "b200_nvlink_degraded": profile(
            **b200, driver="580.95.05", cuda="13.0", gpus=nvlink_gpus("NVIDIA B200", 183359, "10.0"),
            topology=edit_topology(b200_topology_tabs, pcie_only_gpu=3), allreduce=at_pcie_speed,
            derived="FAULT: GPU3 reaches the others over PCIe only (NODE/SYS), like the public degraded report; "
            + b200_derived,
        ),
        "b200_nvlink_7gpu": profile(
            **b200, driver="580.95.05", cuda="13.0", gpus=nvlink_gpus("NVIDIA B200", 183359, "10.0", count=7),
            topology=edit_topology(b200_topology_tabs, drop_gpu=7), allreduce=nvlink,
            derived="FAULT: GPU7 missing (7 of 8 visible, like a public HGX B300 report); " + b200_derived,
        ),
        "b200_nvlink_slow_allreduce": profile(
            **b200, driver="580.95.05", cuda="13.0", gpus=nvlink_gpus("NVIDIA B200", 183359, "10.0"),
            topology=b200_topology, allreduce=at_pcie_speed,
            derived="FAULT: topo -m reads NV18 everywhere but the all-reduce runs at PCIe speed; " + b200_derived,
        ),
        "h100_sxm": profile(
            source="tests/fixtures/nvidia-smi/h100-8x-nvlink-topo-rows-only (real, published 8x H100 topo -m) and "
            "a real H100 host's nvidia-smi: 'NVIDIA H100 80GB HBM3', 81559 MiB (notes sglang.md section 11), "
            "compute capability 9.0",
            driver="580.95.05", cuda="13.0", gpus=nvlink_gpus("NVIDIA H100 80GB HBM3", 81559, "9.0"),
            topology=hopper_topology, nvswitch=True, allreduce=nvlink, derived=hopper_derived,
        ),
        "h200_sxm": profile(
            source="tests/fixtures/nvidia-smi/h200-x2 (real, two GPUs of an H200 board: 'NVIDIA H200', 143771 MiB, "
            "compute capability 9.0, NV18) and h100-8x-nvlink-topo-rows-only (the same NVLink4 HGX board's topo -m)",
            driver="580.95.05", cuda="13.0", gpus=nvlink_gpus("NVIDIA H200", 143771, "9.0"),
            topology=hopper_topology, nvswitch=True, allreduce=nvlink,
            derived="8 GPUs where the capture lent 2; " + hopper_derived,
        ),
        "b300_nvlink": profile(
            source="synthesized from NVIDIA's published B300 HGX figures (no capture): 'NVIDIA B300 SXM6 AC', "
            "275040 MiB, compute capability 10.3, NV18 between every pair",
            driver="580.95.05", cuda="13.0", gpus=nvlink_gpus("NVIDIA B300 SXM6 AC", 275040, "10.3"),
            topology=synthesized_nvlink_topology(8, legend), nvswitch=True, allreduce=nvlink,
        ),
    }


def build(out_dir: Path) -> None:
    for name, files in profiles().items():
        shutil.rmtree(out_dir / name, ignore_errors=True)
        for relative, text in files.items():
            path = out_dir / name / relative
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)


if __name__ == "__main__":
    build(Path(sys.argv[1]) if len(sys.argv) > 1 else PROFILES_DIR)
