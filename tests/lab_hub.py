"""The lab hub on 127.0.0.1 for tests on the controller (no lab host), and a huggingface_hub client that sees only it.

Importing this sets the client's environment, read by huggingface_hub at import time: plain HTTP only,
no stray token or cache. The `hub` fixture (tests/conftest.py) serves it; every call passes endpoint=
and an explicit token, so nothing depends on when huggingface_hub read HF_ENDPOINT.
"""

import os
import tempfile
from pathlib import Path

os.environ["HF_HUB_DISABLE_XET"] = "1"
os.environ["HF_HOME"] = tempfile.mkdtemp(prefix="specfleet-hf-home-")
os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"
for var in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_ENDPOINT"):
    os.environ.pop(var, None)

from speed.repos import build_bench_repo  # noqa: E402
from lab import repos  # noqa: E402
from lab.hub import read_request_log, start_hub  # noqa: E402

KIMI, DRAFTER = repos.KIMI, repos.KIMI_DFLASH
QWEN, QWEN_RETRAINED = repos.QWEN, repos.QWEN_RETRAINED
BIG = "lab/resume-bench"  # one 24 MiB shard: big enough for the client's 10 MiB resume steps


def start(store: Path, state: Path):
    """The hub over the lab's repos and BIG, built in STORE; its `shas` are repo id -> commit."""
    shas = repos.build_lab_repos(store)
    shas[BIG] = build_bench_repo(store, BIG, 24 * 1024 * 1024, shards=1)
    # A tiny tree page so every listing exercises Link pagination.
    server = start_hub(store, state, tree_page_size=4)
    server.shas = shas
    return server


def repo_files(hub, repo_id) -> Path:
    return hub.store / "models" / repo_id / "files"


def new_log_entries(hub, since: int) -> list[dict]:
    return read_request_log(hub.state)[since:]
