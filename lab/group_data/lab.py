"""Only what differs in the lab (`python -m lab up`): its hub, its package index, tiny models.

pyinfra loads this file for `pyinfra lab/inventory.py ...` only (it sits next to that
inventory), so real inventories never import the lab. The lab's hub serves tiny repos
laid out like the real ones (lab/repos.py), under their own ids and commits; its index
serves huggingface_hub and the SGLang stand-in (lab/sglang_standin: a labelled stand-in
for the engine, which needs GPUs).
"""

from lab import config

hf_endpoint = config.HUB_URL
pip_index_url = config.INDEX_URL

# The real repos and SGLang builds, as the lab serves them (commits: lab/repos.py builds
# these exact bytes; tests/unit/test_deployment.py::test_lab_pins_are_the_commits_the_lab_hub_builds
# keeps the two in step).
mirrors = dict(
    repos={
        "moonshotai/Kimi-K2.6": "lab/Kimi-K2.6-tiny@301e6e07c505cb089c241b08fd4309967629b1c7",
        "z-lab/Kimi-K2.6-DFlash": "lab/Kimi-K2.6-DFlash-tiny@2a8aa93380f769c31e6b66b6d1b736180c23b058",
        "Qwen/Qwen3.6-27B": "lab/Qwen3.6-27B-tiny@486dd609013642a52d0bf93941f6c21d3fb7ee37",
        "z-lab/Qwen3.6-27B-DFlash": "lab/Qwen3.6-27B-DFlash-tiny@4abbd50e31b36b8b4b9754e84bb313d7196e632e",
    },
    requirements={
        # The DDTree pull request's build, as the lab's second stand-in build.
        "sglang @ git+https://github.com/sgl-project/sglang@refs/pull/29907/head#subdirectory=python":
            f"sglang @ {config.WHEELS_URL}sglang-0.5.23+lab.ddtree29907-py3-none-any.whl",
    },
)

ready_timeout_s = 60  # the stand-in is ready in about a second

# LAB STAND-IN for the GPU smoke test's torch + NCCL (the lab has neither): it answers from the
# host's GPU profile (lab/host_files/usr/lib/specfleet-lab/gpu-allreduce-standin).
gpu_smoke_engine = "/usr/lib/specfleet-lab/gpu-allreduce-standin"
