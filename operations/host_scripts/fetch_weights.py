"""Runs ON THE HOST, as the download unit: fetch one pinned repo into its directory.

Usage: fetch_weights.py SPEC.json, where SPEC holds repo_id, commit, local_dir and
the hub's file list (path, size, sha256 or git_sha1). The token comes from
HF_HOME's token file, never from arguments.

huggingface_hub does not resume a partial file after the process dies (its
temporary names are unique per process, and it writes in 10 MiB blocks), and it
leaves the partial file behind. So this script clears those, removes files whose
size is wrong (truncated), fetches the large (LFS) files itself into
`.cache/specfleet/parts/<path>.part`, resuming each with an HTTP Range request
from the bytes already on disk, then lets snapshot_download fetch the rest (it
skips what is in place), checks every size, and only then writes the manifest
that marks the repo complete. Anything the resumable fetch cannot do, it leaves
to snapshot_download.
"""

import json
import os
import sys
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from huggingface_hub import get_token, hf_hub_url, snapshot_download
from huggingface_hub._local_folder import write_download_metadata

MANIFEST = ".specfleet-manifest.json"
PARTS = ".cache/specfleet/parts"
BLOCK = 1 << 20  # written and flushed per block: a kill loses at most what was in flight


def fetch_resumable(spec: dict, entry: dict, local_dir: Path, token: str | None) -> str:
    """Fetch one LFS file into place, continuing its .part file; what happened, for the journal."""
    final = local_dir / entry["path"]
    if final.is_file() and final.stat().st_size == entry["size"]:
        return ""
    part = local_dir / PARTS / f"{entry['path']}.part"
    part.parent.mkdir(parents=True, exist_ok=True)
    done = part.stat().st_size if part.exists() else 0
    if done > entry["size"]:
        part.unlink()
        done = 0
    url = hf_hub_url(spec["repo_id"], entry["path"], revision=spec["commit"],
                     endpoint=os.environ.get("HF_ENDPOINT"))
    request = urllib.request.Request(url, headers={"Range": f"bytes={done}-"} if done else {})
    if token:
        # Not sent on to the redirect: LFS content comes from a signed CDN URL that refuses it.
        request.add_unredirected_header("Authorization", f"Bearer {token}")
    with urllib.request.urlopen(request, timeout=60) as response, part.open("ab") as out:
        if done and response.status != 206:  # the server ignored the Range: start over
            out.truncate(0)
            done = 0
        for block in iter(lambda: response.read1(BLOCK), b""):
            out.write(block)
            out.flush()
    if part.stat().st_size != entry["size"]:
        raise OSError(f"{entry['path']}: {part.stat().st_size} bytes after the transfer, {entry['size']} expected")
    final.parent.mkdir(parents=True, exist_ok=True)
    os.replace(part, final)
    # What snapshot_download itself records, so it takes the file as downloaded at this commit.
    write_download_metadata(local_dir, entry["path"], spec["commit"], entry["sha256"])
    return f"resumed {entry['path']} at byte {done}" if done else f"fetched {entry['path']}"


def fetch_large_files(spec: dict, local_dir: Path) -> None:
    token = get_token()
    large = [e for e in spec["files"] if e.get("sha256")]

    def one(entry):
        try:
            return fetch_resumable(spec, entry, local_dir, token)
        except Exception as error:  # snapshot_download fetches it instead
            return f"{entry['path']}: resumable fetch failed ({error}); left to snapshot_download"

    with ThreadPoolExecutor(max_workers=8) as pool:
        for message in pool.map(one, large):
            if message:
                print(message, flush=True)


def main(spec_path: str) -> int:
    spec = json.loads(Path(spec_path).read_text())
    local_dir = Path(spec["local_dir"])
    local_dir.mkdir(parents=True, exist_ok=True)
    (local_dir / MANIFEST).unlink(missing_ok=True)  # incomplete until proven otherwise
    for stale in (local_dir / ".cache/huggingface/download").glob("**/*.incomplete"):
        stale.unlink()
    for entry in spec["files"]:
        path = local_dir / entry["path"]
        if path.exists() and path.stat().st_size != entry["size"]:
            print(f"re-fetching {entry['path']}: {path.stat().st_size} bytes on disk, "
                  f"{entry['size']} on the hub", flush=True)
            path.unlink()
    fetch_large_files(spec, local_dir)
    snapshot_download(spec["repo_id"], revision=spec["commit"], local_dir=local_dir)
    wrong = [e["path"] for e in spec["files"]
             if not (local_dir / e["path"]).is_file()
             or (local_dir / e["path"]).stat().st_size != e["size"]]
    if wrong:
        print(f"sizes still differ from the hub after download: {wrong}", file=sys.stderr)
        return 1
    manifest = {key: spec[key] for key in ("repo_id", "commit")}
    manifest["files"] = {e["path"]: {k: e[k] for k in ("size", "sha256", "git_sha1")} for e in spec["files"]}
    (local_dir / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True))
    print(f"{spec['repo_id']}@{spec['commit']}: {len(spec['files'])} files complete", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
