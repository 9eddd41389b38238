"""`python -m tools.gpu capture OUTDIR [--class b200_nvlink]`: on a GPU host, take one fixture.

Run from the repository root ON the GPU host (the device machine). It writes into OUTDIR:

- the raw nvidia-smi outputs (RAW_CAPTURES; serial numbers, PDIs and UUIDs zeroed, the UUIDs
  numbered in order of appearance so the GPUs stay apart);
- ``facts.txt``: what ``pyinfra @local fact`` printed for every GPU fact the deploy reads (FACTS);
- ``pyinfra-smoke.txt`` and ``record.json``: the deploy's GPU smoke test (operations.gpu.smoke),
  run by ``pyinfra -y @local tools/gpu/smoke_at_local.py`` on all GPUs, with the host's
  python standing in for the SGLang venv and NO_MULTICAST forced into the NCCL environment;
- ``judged.json``: ``judge()`` over the folder (the processing part, also ``--judge-only DIR``):
  classify, the class check, NVSwitch, fabric manager unit state and registration, the smoke
  verdict and bus bandwidth by message size;
- ``case.json``: date, kernel, driver, CUDA, torch and NCCL, the environment, the command.

The replay tests (tests/unit/test_gpu_capture_replay.py) take every fixture folder holding a
``judged.json``. This is the one capture command; the 2x H200 captures before it were ad-hoc
scripts (tests/fixtures/nvidia-smi/h200-x2-smoke/smoke_at_local.py).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

from deployment.gpu.config import expected_gpus
from operations.basics import host_programs
from operations.gpu.checks import check_fabric, check_gpu_class
from operations.gpu.parse import parse_smi_q
from operations.gpu.smoke import summary

from .classify import classify_dir, load_class_expectations

REPO = Path(__file__).resolve().parents[2]
HOST = "@local"
# The lending machines forbid NVLink multicast (NVLS); the smoke test runs with these forced on.
NO_MULTICAST = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
RAW_CAPTURES = {
    "query.csv": "nvidia-smi --query-gpu=index,name,uuid,pci.bus_id,driver_version,memory.total,"
                 "persistence_mode,compute_cap,mig.mode.current --format=csv",
    "topo.txt": "nvidia-smi topo -m",
    "topo_p2p_r.txt": "nvidia-smi topo -p2p r",
    "q.txt": "nvidia-smi -q",
    "q.xml": "nvidia-smi -q -x",
    "smi.txt": "nvidia-smi",
    "nvlink-s.txt": "nvidia-smi nvlink -s",
    "proc_driver_nvidia_version.txt": "cat /proc/driver/nvidia/version",
}
FACTS = ["NvidiaHost", "NvidiaGpus", "NvidiaTopology", "NvidiaDriver", "NvidiaFabric", "RebootPending"]
UUID = re.compile(r"\b(GPU-)?([0-9a-fA-F]{8})-([0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4})-([0-9a-fA-F]{12})\b")
SERIALS = [
    re.compile(r"^(\s*(?:Serial Number|GPU PDI)\s*:\s*)((?!N/A)\S+)", re.M),
    re.compile(r"(<(?:serial|pdi)>)((?!N/A)[^<]+)(?=</)"),
]


def _zeroed(value: str) -> str:
    head = "0x" if value.startswith("0x") else ""  # a PDI stays hexadecimal
    return head + re.sub(r"[0-9A-Za-z]", "0", value[len(head):])


def zero_identifiers(text: str, uuids: dict[str, int]) -> str:
    """Zero serial numbers, PDIs and UUIDs; `uuids` numbers each UUID across all files of a capture."""
    def zeroed_uuid(match: re.Match) -> str:
        if match.group(3) == "0000-0000-0000":  # zeroed already
            return match.group(0)
        number = uuids.setdefault(match.group(0).removeprefix("GPU-").lower(), len(uuids))
        return f"{match.group(1) or ''}{number:08x}-0000-0000-0000-{number:012x}"

    text = UUID.sub(zeroed_uuid, text)
    for pattern in SERIALS:
        text = pattern.sub(lambda match: match.group(1) + _zeroed(match.group(2)), text)
    return text


def facts_printed(text: str) -> dict:
    """{fact class name: value} from what ``pyinfra @local fact operations.gpu.facts.X ...`` printed."""
    pattern = r"--> Fact data for: operations\.gpu\.facts\.(\w+)\n(\{.*?\n\})\n"
    return {name: json.loads(block)[HOST] for name, block in re.findall(pattern, text, re.S)}


def judge(folder: Path, class_name: str = "b200_nvlink") -> dict:
    """What the deploy makes of a capture folder, computed from its files alone."""
    facts = facts_printed((folder / "facts.txt").read_text())
    expected = expected_gpus(load_class_expectations()[class_name])
    fabric = facts["NvidiaFabric"]
    record = json.loads((folder / "record.json").read_text()) if (folder / "record.json").exists() else None
    return dict(
        class_name=class_name,
        classify=classify_dir(folder),
        class_problems=check_gpu_class(
            HOST, class_name, expected, gpus=facts["NvidiaGpus"], topology=facts["NvidiaTopology"],
            driver=facts["NvidiaDriver"], reboot_pending=facts["RebootPending"]),
        nvswitch=fabric["nvswitch"],
        fabric_units=fabric["units"],
        fabric_registration={gpu["pci_bus_id"]: f"{gpu['fabric_state']}/{gpu['fabric_status']}" for gpu in fabric["gpus"]},
        fabric_problems=check_fabric(HOST, class_name, expected, fabric),
        smoke=None if record is None else dict(
            verdict=record["verdict"], gpus=record["gpus"], floor_gbps=record["floor_gbps"],
            busbw_gbps_by_mib={str(result["bytes"] >> 20): result["busbw_gbps"] for result in record["results"]},
            summary=summary(record)),
    )


def _shell(command: str, env: dict | None = None, timeout: int = 120) -> str:
    done = subprocess.run(command, shell=True, cwd=REPO, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})
    return done.stdout + done.stderr + ("" if done.returncode == 0 else f"rc={done.returncode}\n")


def take(outdir: Path, class_name: str) -> dict:
    """Take the capture on this host (needs nvidia-smi, torch and pyinfra here) and judge it."""
    outdir.mkdir(parents=True, exist_ok=True)
    uuids: dict[str, int] = {}
    for file_name, command in RAW_CAPTURES.items():
        (outdir / file_name).write_text(zero_identifiers(_shell(command), uuids))
    fact_names = " ".join(f"operations.gpu.facts.{name}" for name in FACTS)
    facts = _shell(f"{sys.executable} -m pyinfra @local fact {fact_names}")
    (outdir / "facts.txt").write_text(zero_identifiers(facts, uuids))

    install_dir = Path("/tmp/specfleet-capture")  # the smoke test's INSTALL_DIR: its bin/ and its "venv"
    (install_dir / "bin").mkdir(parents=True, exist_ok=True)
    for program in host_programs.of_subject("gpu").values():  # gpu_smoke.py and the programs it imports
        shutil.copy(program, install_dir / "bin")
    venv = install_dir / "sglang-venv"
    if not venv.is_symlink():
        venv.symlink_to(sys.prefix)
    started = time.monotonic()
    smoke = _shell(f"{sys.executable} -m pyinfra -y @local tools/gpu/smoke_at_local.py",
                   env={**NO_MULTICAST, "SPECFLEET_SMOKE_INSTALL_DIR": str(install_dir),
                        "SPECFLEET_SMOKE_CLASS": class_name}, timeout=400)  # the device allows 600 s a call
    (outdir / "pyinfra-smoke.txt").write_text(smoke)
    if (install_dir / "gpu-smoke.json").exists():
        shutil.copy(install_dir / "gpu-smoke.json", outdir / "record.json")

    judged = judge(outdir, class_name)
    (outdir / "judged.json").write_text(json.dumps(judged, indent=2) + "\n")
    versions = _shell(f"{sys.executable} -c 'import torch; print(torch.__version__, torch.cuda.nccl.version())'")
    driver = parse_smi_q((outdir / "q.txt").read_text().splitlines())
    case = dict(
        case=outdir.name, made_by=f"python -m tools.gpu capture OUTDIR --class {class_name}",
        date=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), kernel=os.uname().release,
        driver_version=driver["driver_version"], cuda_version=driver["cuda_version"],
        gpu_name=judged["classify"]["gpu_name"], gpu_count=judged["classify"]["gpu_count"],
        torch_nccl=versions.strip(), environment=NO_MULTICAST, smoke_seconds=round(time.monotonic() - started, 1),
        files=sorted({path.name for path in outdir.iterdir()} | {"case.json"}),
    )
    (outdir / "case.json").write_text(json.dumps(case, indent=2) + "\n")
    return judged
