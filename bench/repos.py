"""Benchmark repos in this lab's hub store, served to the deploy through group_data mirrors."""

from pathlib import Path

from bench.common import WORK
from tests.helpers import write_group_data
from lab.repos import build_bench_repo, repo_dir
from lab.services import HUB_STORE

GB2 = 2 * 1024 ** 3  # 2 GiB: hashing it would take seconds, so a no-op that hashed would show
TARGET_REPO = "moonshotai/Kimi-K2.6"  # the real target id the lab profile deploys


def ensure(repo_id: str, total_bytes: int, shards: int) -> str:
    """Build (once) and return the repo's commit."""
    return build_bench_repo(HUB_STORE, repo_id, total_bytes, shards)


def files_of(repo_id: str) -> Path:
    return repo_dir(HUB_STORE, repo_id) / "files"


def target_override(name: str, repo_id: str, commit: str, weights_dir: str) -> Path:
    """A --group-data folder pointing the deploy's target at REPO_ID@COMMIT, downloaded into WEIGHTS_DIR."""
    return write_group_data(WORK / "group_data" / name, "lab", (
        "mirrors = copy.deepcopy(base['mirrors'])\n"
        f"mirrors['repos'][{TARGET_REPO!r}] = {repo_id + '@' + commit!r}\n"
        f"weights_dir = {weights_dir!r}"))
