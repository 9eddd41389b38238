"""Runs ON THE HOST, as the download unit: fetch one pinned repo into its directory.

Usage: fetch_weights.py SPEC.json, where SPEC holds repo_id, commit, local_dir and
the hub's file list (path, size, sha256 or git_sha1). The token comes from
HF_HOME's token file, never from arguments.

huggingface_hub does not resume a partial file after the process dies, and it
leaves the partial file behind; so this script clears those, removes files whose
size is wrong (truncated), lets snapshot_download fetch what is missing, checks
every size, and only then writes the manifest that marks the repo complete.
"""

import json
import sys
from pathlib import Path

from huggingface_hub import snapshot_download

MANIFEST = ".specfleet-manifest.json"


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
