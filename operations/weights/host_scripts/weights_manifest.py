"""The weights listing and manifest, shared by the controller and every host-side weights program.

Standard library only: it runs on the hosts' system python3 (imported by
fetch_weights.py next to it, or sent inline with the other programs, see
operations/host_programs.py) and on the controller (operations/hub.py).

A listing is the hub's file list for one commit, as the controller validated it:
    [{"path": "model-00001-of-00064.safetensors", "size": 9825, "sha256": "...", "git_sha1": null}, ...]
sha256 is set for LFS files, git_sha1 (git's blob id) for the others.

The manifest, written into a weights directory once every file is in place, marks it complete:
    {"repo_id": "...", "commit": "<40 hex>", "files": {path: {"size", "sha256", "git_sha1"}},
     "received": {"hub": bytes, "peers": bytes, "by_peer": {host: bytes}}}
("received": the bytes the fetch took from each source, weights_sources.py).
"""

import hashlib
import json
import os
import re
import stat
import unicodedata

MANIFEST = ".specfleet-manifest.json"
RESERVED = (".cache", MANIFEST)  # first path segments the fetcher and the manifest own
COMMIT = re.compile(r"[0-9a-f]{40}")  # knobs.COMMIT on the hosts, which lack the product (a test keeps them equal)
SHA256 = re.compile(r"[0-9a-f]{64}")


def path_problem(path) -> str | None:
    """Why a repo file name may not be written under a weights directory; None when it may."""
    if not isinstance(path, str) or not path:
        return "not a non-empty string"
    if path.startswith("/"):
        return "absolute"
    if any(unicodedata.category(c) in ("Cc", "Zl", "Zp") for c in path):
        return "holds a control character"
    segments = path.split("/")
    if any(s in ("", ".", "..") for s in segments):
        return "has an empty, '.' or '..' segment"
    if segments[0] in RESERVED:
        return f"is under {segments[0]}, which specfleet itself writes"
    return None


def entry_problem(entry: dict) -> str | None:
    """Why a listing entry is not a safe path with a size and a well-formed hash; None when it is."""
    problem = path_problem(entry.get("path"))
    if problem:
        return f"file name {entry.get('path')!r} {problem}"
    size = entry.get("size")
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        return f"{entry['path']}: size {size!r} is not a byte count"
    if entry.get("sha256") is not None and not SHA256.fullmatch(str(entry["sha256"])):
        return f"{entry['path']}: sha256 {entry['sha256']!r} is not 64 hex digits"
    if entry.get("sha256") is None and not COMMIT.fullmatch(str(entry.get("git_sha1"))):
        return f"{entry['path']}: git blob id {entry.get('git_sha1')!r} is not 40 hex digits"
    return None


def inside(directory, path: str) -> str:
    """DIRECTORY/PATH with links resolved, refused (ValueError) unless it stays inside DIRECTORY."""
    if not isinstance(path, str) or not path or path.startswith("/"):
        raise ValueError(f"refusing file name {path!r}: not a relative path")
    root = os.path.realpath(directory)
    full = os.path.realpath(os.path.join(root, path))
    if os.path.commonpath([root, full]) != root or full == root:
        raise ValueError(f"refusing file name {path!r}: it resolves to {full}, outside {root}")
    return full


def digest_for(entry: dict):
    """A hash object primed as the hub hashes ENTRY: sha256 of LFS content, else git's blob sha1."""
    if entry.get("sha256"):
        return hashlib.sha256()
    return hashlib.sha1(b"blob %d\0" % entry["size"])


def expected_digest(entry: dict) -> str:
    return entry.get("sha256") or entry["git_sha1"]


def hash_file(path, entry: dict, block: int = 1 << 22) -> str:
    digest = digest_for(entry)
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(block), b""):
            digest.update(chunk)
    return digest.hexdigest()


MAX_MANIFEST_BYTES = 64 << 20  # a manifest lists a few thousand files at most (~200 bytes each)


def read(directory) -> dict | None:
    """The directory's manifest, or None when it has none (incomplete) or it is unreadable.

    Root reads it too (weights_state.py), in a directory the service user owns: a link there is not
    followed (it could name any file of the host) and nothing but a regular file is read (a FIFO
    would block the reader), so it is opened without following a link and without blocking.
    """
    try:
        fd = os.open(os.path.join(directory, MANIFEST), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_size > MAX_MANIFEST_BYTES:
            return None
        with os.fdopen(fd, "rb") as f:
            fd = None
            manifest = json.loads(f.read(MAX_MANIFEST_BYTES + 1))
    except (OSError, ValueError):
        return None
    finally:
        if fd is not None:
            os.close(fd)
    return manifest if isinstance(manifest, dict) else None


def write(directory, repo_id: str, commit: str, listing: list[dict], received: dict | None = None) -> None:
    manifest = {"repo_id": repo_id, "commit": commit,
                "files": {e["path"]: {k: e.get(k) for k in ("size", "sha256", "git_sha1")} for e in listing}}
    if received is not None:
        manifest["received"] = received
    tmp = os.path.join(directory, f".{MANIFEST}.tmp")
    with open(tmp, "w") as f:
        json.dump(manifest, f, indent=1, sort_keys=True)
    os.replace(tmp, os.path.join(directory, MANIFEST))


def remove(directory) -> None:
    try:
        os.unlink(os.path.join(directory, MANIFEST))
    except FileNotFoundError:
        pass


# What a revision directory holds, as weights_on_disk.py reads it on the host, compared with the hub's listing:
# on the host by weights_state.py and weights_disk.py, and on the controller from the answer the deploy gathers
# while the hub answers (weights.checks.WeightsOnDisk).

def revisions_besides(path: str, repo: dict) -> list[dict]:
    """The revisions of a repo (weights_on_disk.repo's answer) other than PATH: each one's manifest and the
    regular files it holds, by size."""
    found = [repo["legacy"]] if repo.get("legacy") else []
    for entry_path, entry in repo["entries"].items():
        if entry_path != path and entry.get("dir"):
            found.append({"manifest": entry["manifest"],
                          "present": {name: size for name, (size, regular) in entry["files"].items() if regular}})
    return found


def held_elsewhere(others: list[dict]) -> list[str]:
    """The content the other revisions hold ("sha256:HEX:SIZE" or "git_sha1:HEX:SIZE"), as their manifests
    recorded files still there: what the fetcher links instead of fetching."""
    found = set()
    for other in others:
        manifest = other["manifest"] or {}
        files = manifest.get("files") if isinstance(manifest.get("files"), dict) else {}
        for path, record in files.items():
            if not isinstance(record, dict) or path_problem(path) or path not in other["present"]:
                continue
            kind = "sha256" if record.get("sha256") else "git_sha1"
            if other["present"][path] == record.get("size"):
                found.add(f"{kind}:{record.get(kind)}:{record.get('size')}")
    return sorted(found)


def disk_of(entry: dict, others: list[dict]) -> dict:
    """A revision directory's room (weights_disk.py's answer): {"linked": true} for a link, which preflight
    refuses; else the free bytes and device of the filesystem holding it, the files there outside the
    fetcher's scratch (.cache) with their own sizes, and what the other revisions hold."""
    if entry.get("linked"):
        return {"linked": True}
    return {"free": entry["free"], "device": entry["device"], "checked": entry["checked"],
            "files": {name: size for name, (size, _) in entry["files"].items()
                      if ".cache" not in name.split("/")[:-1]},
            "others": held_elsewhere(others)}


def state_of(entry: dict, sizes: dict[str, int]) -> dict | None:
    """A revision directory's completeness (weights_state.py's answer) against the hub's sizes: None without
    a manifest (or for a link: root reads nothing through it), else the manifest's commit and the listed
    files whose size differs, that are no regular file reached through no link, or that it does not record
    (an edited or older manifest)."""
    manifest = None if entry.get("linked") else entry.get("manifest")
    if manifest is None:
        return None
    recorded = manifest.get("files") if isinstance(manifest.get("files"), dict) else {}

    def regular_size(path: str) -> int | None:
        size, regular = entry["files"].get(path, (None, False))
        return size if regular else None

    return {"commit": manifest.get("commit"),
            "bad": [path for path, size in sizes.items() if path not in recorded or regular_size(path) != size]}


def no_directory(filesystem: dict) -> dict:
    """A revision that is no directory (absent, or a file), on the filesystem that holds it or will."""
    return {**filesystem, "dir": False, "manifest": None, "files": {}}


def revision(repo: dict, path: str) -> dict:
    """The revision directory PATH in a repo weights_on_disk.repo read: its entry, or, not there yet, room on
    what will hold it."""
    return repo["entries"].get(path) or no_directory(repo["here"])
