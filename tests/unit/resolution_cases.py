"""Rendered command lines as resolution cases: a class's deployment, its GPU, the lab's tiny repos.

Shared by the real-SGLang resolution test and the stand-in agreement test, so both judge the
same argv with the same GPU.
"""

import json
from dataclasses import replace
from pathlib import Path

from lab.repos import build_lab_repos, repo_dir
from deployment.hosts import resolve
from deployment.server.command_line import server_args
from deployment.server.config import Server
from deployment.server.speculative import ALGORITHMS
from tests.unit.group_data import host_data

REPO = Path(__file__).resolve().parents[2]
GPU_PROFILES = REPO / "lab" / "gpu_standin" / "profiles"
PROFILES = ("kimi_k26_dflash", "qwen36_ddtree", "kimi_k26_ddtree")
# The shipped profiles without a drafter repo: a model's own MTP layers, and none.
DRAFTERLESS = ("qwen36_mtp", "qwen36_ar")


def class_gpu(host_class: str) -> dict:
    """The class's GPU as the lab's GPU stand-in describes it (built from real nvidia-smi captures)."""
    gpus = json.loads((GPU_PROFILES / host_class / "profile.json").read_text())["gpus"]
    return {"name": gpus[0]["name"], "compute_capability": gpus[0]["compute_cap"], "count": len(gpus),
            "memory_mib": gpus[0]["memory_total_mib"]}


def lab_repos(store: Path) -> dict[str, str]:
    """Build the lab's tiny repos under `store`; real repo id -> the folder standing in for it."""
    build_lab_repos(store)
    mirrors = host_data("b200_nvlink", lab=True).mirrors["repos"]
    return {real: str(repo_dir(store, pinned.split("@")[0]) / "files") for real, pinned in mirrors.items()}


def deployment(host_class: str, profile: str, repos: dict[str, str], **changes) -> Server:
    """The real (non-lab) server of `profile` on `host_class`, with its weights at the lab repos."""
    d = resolve(host_data(host_class, profile=profile), host_class)
    profile_repos = host_data(host_class).profiles[profile]
    drafter = repos[profile_repos["drafter"]["repo"]] if "drafter" in profile_repos else None
    return replace(d.replicas[0], engine=replace(d.engine, model_dir=repos[profile_repos["target"]["repo"]],
                                                 draft_model_dir=drafter, **changes))


def as_released(argv: list[str]) -> list[str]:
    """A command line of an algorithm in no release (DDTree) as the release it builds on (PR #29907
    branches from 0.5.23) sees it: the base algorithm's drafting (DFLASH) and none of its own flags.
    The deploy checks the algorithm's own rules on the result."""
    algorithm = ALGORITHMS.get(argv[argv.index("--speculative-algorithm") + 1]) \
        if "--speculative-algorithm" in argv else None
    if algorithm is None or algorithm.base is None:
        return list(argv)
    own = {setting.flag for setting in algorithm.settings.values()}
    out, skip = [], False
    for i, arg in enumerate(argv):
        if skip:
            skip = False
        elif arg in own:
            skip = True
        elif arg == algorithm.name and argv[i - 1] == "--speculative-algorithm":
            out.append(algorithm.base)
        else:
            out.append(arg)
    return out


def case(d: Server) -> dict:
    return {"argv": as_released(server_args(d)), "env": dict(d.engine.env), "gpu": class_gpu(d.engine.host_class)}
