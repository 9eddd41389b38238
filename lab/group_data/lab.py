"""Only what differs in the lab (`python -m lab up`): its hub, its package index, tiny models.

pyinfra loads this file for `pyinfra lab/inventory.py ...` only (it sits next to that
inventory), so real inventories never import the lab. The lab's hub serves tiny repos
laid out like the real ones (lab/repos.py), under their own ids and commits; its index
serves huggingface_hub and the SGLang stand-in (lab/sglang_standin: a labelled stand-in
for the engine, which needs GPUs).
"""

from lab import config
from lab.index import standin_requirement

hf_endpoint = config.HUB_URL
pip_index_url = config.INDEX_URL
allow_http_hub = allow_http_index = True  # the lab's hub and index serve plain HTTP on the lab network
nvidia_repo_url = config.APT_URL  # the lab's signed stand-in of NVIDIA's repository (lab/apt_repo.py)
allow_http_nvidia_repo = True  # the lab's repository is served over plain HTTP on the lab network

# The real repos and SGLang builds, as the lab serves them (commits: lab/repos.py builds
# these exact bytes; tests/unit/test_deployment.py::test_lab_pins_are_the_commits_the_lab_hub_builds
# keeps the two in step).
mirrors = dict(
    repos={
        "moonshotai/Kimi-K2.6": "lab/Kimi-K2.6-tiny@cab62ee5866130af4b3f1e1a6a83cf419015a31f",
        "z-lab/Kimi-K2.6-DFlash": "lab/Kimi-K2.6-DFlash-tiny@2a8aa93380f769c31e6b66b6d1b736180c23b058",
        "Qwen/Qwen3.6-27B": "lab/Qwen3.6-27B-tiny@486dd609013642a52d0bf93941f6c21d3fb7ee37",
        "z-lab/Qwen3.6-27B-DFlash": "lab/Qwen3.6-27B-DFlash-tiny@4abbd50e31b36b8b4b9754e84bb313d7196e632e",
    },
    requirements={
        # The release pin, as the stand-in build pinned to its wheel's hash (installed with --require-hashes).
        "sglang==0.5.23": standin_requirement("0.5.23+lab"),
        # The DDTree pull request's build, as the lab's second stand-in build.
        "sglang @ git+https://github.com/sgl-project/sglang@refs/pull/29907/head#subdirectory=python":
            f"sglang @ {config.WHEELS_URL}sglang-0.5.23+lab.ddtree29907-py3-none-any.whl",
    },
)

# The weights' fan-out (deployment/weights/fanout.py) is off in the shared lab, whose hosts often deploy one
# revision side by side: its tests stay as they were. tests/lab/test_weights_fanout.py turns it on.
weights_fanout = False

ready_timeout_s = 60  # the stand-in is ready in about a second
# The benchmark client (bench.py) cannot load the tiny models' tokenizers: a stand-in one.
bench_tokenizer = "lab/sglang_standin/bench_tokenizer"

# The stand-in all-reduce (the lab's torch, lab/gpu_standin/torch) starts in seconds: a hung P2P attempt
# is given up after 20 s.
gpu_smoke_timeout_s = 60

# The lab's one server over two nodes (SPECFLEET_LAB_NODE_GROUP, lab/inventory.py): TP 16 over two
# 8-GPU stand-in hosts, on the lab network (each host's interface to it is nspawn's host0).
node_groups = {"lab-tp16": dict(tp_size=16, dist_init_port=25000, socket_ifname="host0")}

# Prometheus on the lab's gateway scrapes every 5 s, so its checks settle within seconds of a change.
prometheus_scrape_interval_s = 5
