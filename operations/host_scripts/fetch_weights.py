"""Runs ON THE HOST, as the download unit: fetch one pinned repo into its directory.

Usage: fetch_weights.py SPEC.json, where SPEC holds repo_id, commit, local_dir and the
hub's listing as the controller validated it (weights_manifest.py). The token comes from
HF_HOME's token file, never from arguments.

Every file name is checked again here, before anything is written: it must be a safe
relative name that resolves inside local_dir.

huggingface_hub does not resume a partial file after the process dies (its
temporary names are unique per process, and it writes in 10 MiB blocks), and it
leaves the partial file behind; over plain HTTP it checks sizes only. So this script
clears those, removes files whose size is wrong (truncated), fetches the large (LFS)
files itself into `.cache/specfleet/parts/<path>.part`, resuming each with an HTTP
Range request from the bytes already on disk and hashing (sha256) as the bytes arrive
(a resumed file's bytes on disk first), then lets snapshot_download fetch the rest (it
skips what is in place) and hashes what it fetched. A file whose hash differs from the
hub's is deleted and fetched again; only when every file is in place with the hub's
size and hash is the manifest written that marks the repo complete.
"""

import json
import os
import sys
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import weights_manifest
from huggingface_hub import get_token, hf_hub_url, snapshot_download
from huggingface_hub._local_folder import write_download_metadata

PARTS = ".cache/specfleet/parts"
BLOCK = 1 << 20  # written and flushed per block: a kill loses at most what was in flight
ATTEMPTS = 2  # transfers per file whose bytes hash wrong, before the unit fails (and restarts)


class HashMismatch(Exception):
    """A file's bytes do not hash to the hub's value: never to be put in place."""


def transfer(url: str, token: str | None, part: Path, size: int, digest) -> int:
    """Append the rest of URL to PART (from its current size), hashing every byte of PART into
    DIGEST; returns the byte it resumed at."""
    done = part.stat().st_size if part.exists() else 0
    if done > size:
        part.unlink()
        done = 0
    request = urllib.request.Request(url, headers={"Range": f"bytes={done}-"} if done else {})
    if token:
        # Not sent on to the redirect: LFS content comes from a signed CDN URL that refuses it.
        request.add_unredirected_header("Authorization", f"Bearer {token}")
    with urllib.request.urlopen(request, timeout=60) as response, part.open("ab") as out:
        if done and response.status != 206:  # the server ignored the Range: start over
            out.truncate(0)
            done = 0
        if done:  # the bytes already on disk are hashed first
            with part.open("rb") as prefix:
                for block in iter(lambda: prefix.read(1 << 22), b""):
                    digest.update(block)
        for block in iter(lambda: response.read1(BLOCK), b""):
            out.write(block)
            digest.update(block)
            out.flush()
    return done


def fetch_resumable(spec: dict, entry: dict, local_dir: Path, token: str | None) -> str:
    """Fetch one LFS file into place, continuing its .part file; what happened, for the journal."""
    final = Path(weights_manifest.inside(local_dir, entry["path"]))
    if final.is_file() and final.stat().st_size == entry["size"]:
        return ""
    part = Path(weights_manifest.inside(local_dir, f"{PARTS}/{entry['path']}.part"))
    part.parent.mkdir(parents=True, exist_ok=True)
    url = hf_hub_url(spec["repo_id"], entry["path"], revision=spec["commit"], endpoint=os.environ.get("HF_ENDPOINT"))
    notes = []
    for attempt in range(1, ATTEMPTS + 1):
        digest = weights_manifest.digest_for(entry)
        resumed_at = transfer(url, token, part, entry["size"], digest)
        if part.stat().st_size != entry["size"]:
            raise OSError(f"{entry['path']}: {part.stat().st_size} bytes after the transfer, {entry['size']} expected")
        if digest.hexdigest() == weights_manifest.expected_digest(entry):
            break
        part.unlink()
        notes.append(f"sha256 mismatch for {entry['path']} (got {digest.hexdigest()}, the hub lists "
                     f"{entry['sha256']}): deleted" + (", fetching it again" if attempt < ATTEMPTS else ""))
        print(notes[-1], flush=True)
    else:
        raise HashMismatch("; ".join(notes))
    final.parent.mkdir(parents=True, exist_ok=True)
    os.replace(part, final)
    # What snapshot_download itself records, so it takes the file as downloaded at this commit.
    write_download_metadata(local_dir, entry["path"], spec["commit"], entry["sha256"])
    return (f"resumed {entry['path']} at byte {resumed_at}" if resumed_at else f"fetched {entry['path']}") \
        + " (sha256 checked)"


def fetch_large_files(spec: dict, local_dir: Path) -> tuple[set[str], list[str]]:
    """The LFS files, resumably: the paths now in place with the hub's sha256, and the hash failures."""
    token = get_token()
    large = [e for e in spec["files"] if e.get("sha256")]
    hashed, mismatched = set(), []

    def one(entry):
        try:
            message = fetch_resumable(spec, entry, local_dir, token)
            if message:
                hashed.add(entry["path"])
            return message
        except HashMismatch as error:
            mismatched.append(str(error))
            return str(error)
        except Exception as error:  # snapshot_download fetches it instead; hashed afterwards
            return f"{entry['path']}: resumable fetch failed ({error}); left to snapshot_download"

    with ThreadPoolExecutor(max_workers=8) as pool:
        for message in pool.map(one, large):
            if message:
                print(message, flush=True)
    return hashed, mismatched


def unsafe_names(spec: dict, local_dir: Path) -> list[str]:
    problems = []
    for entry in spec["files"]:
        problem = weights_manifest.entry_problem(entry)
        if not problem:
            try:
                weights_manifest.inside(local_dir, entry["path"])
            except ValueError as error:
                problem = str(error)
        if problem:
            problems.append(problem)
    return problems


def main(spec_path: str) -> int:
    spec = json.loads(Path(spec_path).read_text())
    local_dir = Path(spec["local_dir"])
    local_dir.mkdir(parents=True, exist_ok=True)
    refused = unsafe_names(spec, local_dir)
    if refused:
        print(f"refusing the listing, nothing written: {'; '.join(refused)}", file=sys.stderr)
        return 1
    weights_manifest.remove(local_dir)  # incomplete until proven otherwise
    for stale in (local_dir / ".cache/huggingface/download").glob("**/*.incomplete"):
        stale.unlink()
    large_before = {e["path"] for e in spec["files"]
                    if e.get("sha256") and (local_dir / e["path"]).is_file()
                    and (local_dir / e["path"]).stat().st_size == e["size"]}
    for entry in spec["files"]:
        path = local_dir / entry["path"]
        if path.exists() and path.stat().st_size != entry["size"]:
            print(f"re-fetching {entry['path']}: {path.stat().st_size} bytes on disk, "
                  f"{entry['size']} on the hub", flush=True)
            path.unlink()
    hashed, mismatched = fetch_large_files(spec, local_dir)
    if mismatched:
        print(f"bytes that differ from the hub's sha256 twice in a row: {mismatched}", file=sys.stderr)
        return 1
    snapshot_download(spec["repo_id"], revision=spec["commit"], local_dir=local_dir)
    wrong = [e["path"] for e in spec["files"]
             if not (local_dir / e["path"]).is_file()
             or (local_dir / e["path"]).stat().st_size != e["size"]]
    if wrong:
        print(f"sizes still differ from the hub after download: {wrong}", file=sys.stderr)
        return 1
    # What no stream hashed here (small files, and large ones snapshot_download fetched) is hashed now;
    # large files already complete before this run were checked when they were put in place.
    unhashed = [e for e in spec["files"] if e["path"] not in hashed | large_before]
    differ = [e["path"] for e in unhashed
              if weights_manifest.hash_file(local_dir / e["path"], e) != weights_manifest.expected_digest(e)]
    for path in differ:
        (local_dir / path).unlink()
    if differ:
        print(f"hashes differ from the hub's, deleted (the restart fetches them again): {differ}", file=sys.stderr)
        return 1
    weights_manifest.write(local_dir, spec["repo_id"], spec["commit"], spec["files"])
    print(f"{spec['repo_id']}@{spec['commit']}: {len(spec['files'])} files complete", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
