"""The GPU stand-in's nvidia-smi for processes run on the controller (the SGLang stand-in reads its GPU from it)."""

import os
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
GPU_STANDIN = REPO / "lab" / "gpu_standin"


def gpu_standin_env(directory: Path, profile: str) -> dict[str, str]:
    """Environment settings that put nvidia-smi on PATH, showing GPU profile `profile` (e.g. b200_nvlink)."""
    (directory / "bin").mkdir(parents=True, exist_ok=True)
    if not (directory / "bin" / "nvidia-smi").exists():
        (directory / "bin" / "nvidia-smi").symlink_to(GPU_STANDIN / "nvidia-smi")
    (directory / "gpu-profile").write_text(profile)
    return {"PATH": f"{directory / 'bin'}:{os.environ['PATH']}",
            "SPECFLEET_GPU_PROFILE_FILE": str(directory / "gpu-profile"),
            "SPECFLEET_GPU_PROFILES_DIR": str(GPU_STANDIN / "profiles"),
            # the driver the profile's host has loaded (on a lab host: /proc/driver, laid at boot)
            "SPECFLEET_PROC_DRIVER": str(GPU_STANDIN / "profiles" / profile / "proc-driver"),
            "SPECFLEET_GPU_RUN_DIR": str(directory / "run")}
