"""Benchmark repos in this lab's hub store, served to the deploy through group_data mirrors.

`python -m speed.repos --store STORE --repo ID --total-bytes N --shards K` writes one and prints its commit.
"""

import argparse
import hashlib
import json
import os
import sys
from pathlib import Path

from speed.common import WORK
from lab.repos import file_entry, readme, repo_dir, safetensors_header, seeded_bytes, to_json, write_files, \
    write_manifest
from lab.services import HUB_STORE
from tests.helpers import write_group_data

BENCH_BLOCK = 1024 * 1024


def build_bench_repo(store: Path, repo_id: str, total_bytes: int, shards: int) -> str:
    """A big public repo for download benchmarks: SHARDS safetensors of one U8 tensor each.

    The tensor bytes repeat one seeded 1 MiB block, so gigabytes are written at
    disk speed. A rebuild with the same arguments finds the files in place and
    returns at once."""
    params = {"bench": {"total_bytes": total_bytes, "shards": shards}}
    manifest_path = repo_dir(store, repo_id) / "manifest.json"
    base = repo_dir(store, repo_id) / "files"
    if manifest_path.exists():
        manifest = json.loads(manifest_path.read_text())
        if manifest.get("bench") == params["bench"] and all(
                (base / f["path"]).is_file() and (base / f["path"]).stat().st_size == f["size"]
                for f in manifest["files"]):
            return manifest["sha"]

    shard_names = [f"model-{i + 1:05d}-of-{shards:05d}.safetensors" for i in range(shards)]
    index = {"metadata": {"total_size": total_bytes},
             "weight_map": {f"bench.shard_{i}.weight": name for i, name in enumerate(shard_names)}}
    files = {"config.json": to_json({"architectures": ["LlamaForCausalLM"], "model_type": "llama"}),
             "model.safetensors.index.json": to_json(index),
             "README.md": readme(repo_id, "none", "Download benchmark repo.", gated=False)}
    entries = write_files(base, files)
    block = seeded_bytes(f"{repo_id}:block", BENCH_BLOCK)
    for i, name in enumerate(shard_names):
        nbytes = total_bytes // shards + (1 if i < total_bytes % shards else 0)
        entries.append(write_repeated_shard(base / name, f"bench.shard_{i}.weight", nbytes, block))
    return write_manifest(store, repo_id, False, entries, params)


def write_repeated_shard(path: Path, tensor: str, nbytes: int, block: bytes) -> dict:
    """Stream one shard to disk, hashing as it goes; returns its manifest entry."""
    header = safetensors_header([(tensor, "U8", [nbytes], nbytes)])
    sha = hashlib.sha256(header)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as out:
        out.write(header)
        left = nbytes
        while left:
            chunk = block[:min(left, len(block))]
            out.write(chunk)
            sha.update(chunk)
            left -= len(chunk)
    os.replace(tmp, path)
    return file_entry(path.name, len(header) + nbytes, sha.hexdigest(), None)


GB2 = 2 * 1024 ** 3  # 2 GiB: hashing it would take seconds, so a no-op that hashed would show
TARGET_REPO = "moonshotai/Kimi-K2.6"  # the real target id the lab profile deploys


def ensure(repo_id: str, total_bytes: int, shards: int) -> str:
    """Build (once) and return the repo's commit."""
    return build_bench_repo(HUB_STORE, repo_id, total_bytes, shards)


def files_of(repo_id: str) -> Path:
    return repo_dir(HUB_STORE, repo_id) / "files"


def listing(repo_id: str) -> list[dict]:
    """The repo's files as the deploy's hub snapshot lists them (operations.hub.RepoFile.entry)."""
    manifest = json.loads((repo_dir(HUB_STORE, repo_id) / "manifest.json").read_text())
    return [{"path": f["path"], "size": f["size"], "sha256": f["sha256"] if f["lfs"] else None,
             "git_sha1": None if f["lfs"] else f["git_oid"]} for f in manifest["files"]]


def target_override(name: str, repo_id: str, commit: str, weights_dir: str) -> Path:
    """A --group-data folder pointing the deploy's target at REPO_ID@COMMIT, downloaded into WEIGHTS_DIR."""
    return write_group_data(WORK / "group_data" / name, "lab", (
        "mirrors = copy.deepcopy(base['mirrors'])\n"
        f"mirrors['repos'][{TARGET_REPO!r}] = {repo_id + '@' + commit!r}\n"
        f"weights_dir = {weights_dir!r}"))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m speed.repos", description="write one benchmark repo and "
                                     "print its commit sha")
    parser.add_argument("--store", required=True, type=Path)
    parser.add_argument("--repo", required=True)
    parser.add_argument("--total-bytes", required=True, type=int)
    parser.add_argument("--shards", required=True, type=int)
    args = parser.parse_args(argv)
    json.dump({args.repo: build_bench_repo(args.store, args.repo, args.total_bytes, args.shards)}, sys.stdout)
    print()


if __name__ == "__main__":
    main()
