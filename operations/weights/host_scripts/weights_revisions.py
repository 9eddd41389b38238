"""Runs ON THE HOST: the revisions each repo directory holds, and (as the download user, who owns them)
deleting those the deploy no longer keeps.

    weights_revisions.py list REPO_DIR...      (as root: it only reads)
        {"free": {REPO_DIR: bytes free on its filesystem},
         "revisions": {REPO_DIR: {DIR: {"repo_id", "commit", "bytes", "own_bytes", "complete", "time"}}}}
    weights_revisions.py delete REPO_DIR DIR... (as the download user)

A revision is a directory `REPO_DIR/<40 hex>/`, or REPO_DIR itself when it holds a manifest (the
single directory of earlier specfleet versions: its files are the manifest's, beside the revision
directories). `bytes` counts its files; `own_bytes` those no other revision links (what deleting it
frees); `time` is when its manifest was written (0 without one). Deleting the single-directory
revision removes only the files its manifest lists, the manifest and the fetcher's scratch.
"""

import json
import os
import shutil
import sys

import weights_manifest


def revision_dirs(repo_dir: str) -> list[str]:
    try:
        names = sorted(os.listdir(repo_dir))
    except OSError:
        return []
    # A revision directory is named by its commit, as the controller lays it (weights.config.Repo.local_dir).
    found = [os.path.join(repo_dir, n) for n in names if weights_manifest.COMMIT.fullmatch(n)
             and os.path.isdir(os.path.join(repo_dir, n)) and not os.path.islink(os.path.join(repo_dir, n))]
    return ([repo_dir] if weights_manifest.read(repo_dir) else []) + found


def files_of(directory: str, repo_dir: str) -> list[str]:
    """The revision's files: a revision directory's, all of them; the single directory's, its manifest's."""
    if directory == repo_dir:
        manifest = weights_manifest.read(directory) or {}
        listed = manifest.get("files") if isinstance(manifest.get("files"), dict) else {}
        root = os.path.realpath(directory)
        # Regular files only, none reached through a link (a listing's path names no link to follow).
        return [os.path.join(root, path) for path in listed if not weights_manifest.path_problem(path)
                and os.path.realpath(os.path.join(root, path)) == os.path.join(root, path)
                and os.path.isfile(os.path.join(root, path))]
    return [os.path.join(root, name) for root, _dirs, names in os.walk(directory) for name in names
            if not os.path.islink(os.path.join(root, name))]


def describe(directory: str, repo_dir: str) -> dict:
    manifest = weights_manifest.read(directory)
    total = own = 0
    for path in files_of(directory, repo_dir):
        st = os.lstat(path)
        total += st.st_size
        own += st.st_size if st.st_nlink == 1 else 0
    try:
        written = os.stat(os.path.join(directory, weights_manifest.MANIFEST)).st_mtime
    except OSError:
        written = 0
    return {"repo_id": (manifest or {}).get("repo_id"), "commit": (manifest or {}).get("commit"), "bytes": total,
            "own_bytes": own,
            "complete": manifest is not None, "time": written}


def listing(repo_dirs: list[str]) -> dict:
    free, revisions = {}, {}
    for repo_dir in repo_dirs:
        probe = repo_dir
        while not os.path.exists(probe):
            probe = os.path.dirname(probe)
        st = os.statvfs(probe)
        free[repo_dir] = st.f_bavail * st.f_frsize
        revisions[repo_dir] = {d: describe(d, repo_dir) for d in revision_dirs(repo_dir)}
    return {"free": free, "revisions": revisions}


def delete(repo_dir: str, directories: list[str]) -> list[str]:
    """Delete these revisions of REPO_DIR (only what revision_dirs names); the ones deleted."""
    known = set(revision_dirs(repo_dir))
    deleted = []
    for directory in directories:
        if directory not in known:
            continue
        if directory == repo_dir:
            for path in files_of(directory, repo_dir):
                os.unlink(path)
            shutil.rmtree(os.path.join(directory, ".cache"), ignore_errors=True)
            weights_manifest.remove(directory)
        else:
            shutil.rmtree(directory)
        deleted.append(directory)
    return deleted


def answer(args: dict) -> list[str]:
    """WeightsRevisions' lines, for host_state.py."""
    return [json.dumps(listing(list(args["repo_dirs"])))]


if __name__ == "__main__":
    if sys.argv[1] == "list":
        print(json.dumps(listing(sys.argv[2:])))
    else:
        print(json.dumps(delete(sys.argv[2], sys.argv[3:])))
