"""Runs ON THE HOST (sent inline, as root: it only reads): what each repo directory holds, as it is on disk,
for the controller to compare with the hub's listing (weights_manifest.state_of, disk_of).

Usage: weights_on_disk.py REPO_DIR...  Prints JSON, per repo directory: the filesystem of its nearest
existing ancestor (`here`), each entry named by a commit (`entries`, what `directory` reads of it), and the
single directory of earlier specfleet versions when REPO_DIR itself holds a manifest (`legacy`: its
manifest and the files of it still there):

    {"/srv/specfleet/models/moonshotai--Kimi-K2.6":
        {"here": {"checked": "/srv/specfleet/models/moonshotai--Kimi-K2.6", "free": 636707266560, "device": 2049},
         "entries": {"/srv/.../3f2a...": {"dir": true, "checked": "/srv/.../3f2a...", "free": 636707266560,
                                          "device": 2049, "manifest": {...}, "files": {"config.json": [3512, true]}}},
         "legacy": null}}

The answer needs no hub: the deploy asks it while the hub answers, and derives each revision's state and
room on the controller. weights_state.py and weights_disk.py answer their own commands from the same reads.
"""

import json
import os
import stat
import sys

import weights_manifest


def here(directory: str) -> dict:
    """The filesystem that holds DIRECTORY, or will: that of its nearest existing ancestor."""
    probe = directory
    while not os.path.exists(probe):
        probe = os.path.dirname(probe)
    st = os.statvfs(probe)
    return {"checked": probe, "free": st.f_bavail * st.f_frsize, "device": os.stat(probe).st_dev}


def directory(path: str) -> dict:
    """What PATH holds: {"linked": true} for a link (root walks nothing the service user could point
    elsewhere); else its filesystem, whether it is a directory, its manifest (weights_manifest.read) and each
    file below it with its own size and whether it is a regular file (a link is listed, never followed; the
    walk enters no linked directory)."""
    if os.path.islink(path):
        return {"linked": True}
    found = weights_manifest.no_directory(here(path))
    if os.path.isdir(path):
        found.update(dir=True, manifest=weights_manifest.read(path))
        for root, _dirs, names in os.walk(path):
            for name in names:
                st = os.lstat(os.path.join(root, name))
                found["files"][os.path.relpath(os.path.join(root, name), path)] = [st.st_size,
                                                                                   stat.S_ISREG(st.st_mode)]
    return found


def legacy(repo_dir: str) -> dict | None:
    """REPO_DIR as the single directory of earlier versions (it holds a manifest): the manifest, and the
    size of each file it records that is there, a regular file reached through no link."""
    manifest = weights_manifest.read(repo_dir)
    if manifest is None:
        return None
    files = manifest.get("files") if isinstance(manifest.get("files"), dict) else {}
    present = {}
    for path in files:
        if weights_manifest.path_problem(path):
            continue
        full = os.path.join(repo_dir, path)
        inside = os.path.normpath(os.path.join(os.path.realpath(repo_dir), os.path.dirname(path)))
        if os.path.realpath(os.path.dirname(full)) != inside:
            continue  # a linked directory: root looks only inside the revision
        try:
            st = os.lstat(full)
        except OSError:
            continue
        if stat.S_ISREG(st.st_mode):
            present[path] = st.st_size
    return {"manifest": manifest, "present": present}


def repo(repo_dir: str) -> dict:
    try:
        names = sorted(os.listdir(repo_dir))
    except OSError:
        names = []
    # A revision directory is named by its commit, as the controller lays it (weights.config.Repo.local_dir).
    return {"here": here(repo_dir), "legacy": legacy(repo_dir),
            "entries": {os.path.join(repo_dir, n): directory(os.path.join(repo_dir, n))
                        for n in names if weights_manifest.COMMIT.fullmatch(n)}}


def answer(args: dict) -> list[str]:
    """WeightsOnDisk's lines, for host_state.py."""
    return [json.dumps({repo_dir: repo(repo_dir) for repo_dir in args["repo_dirs"]})]


if __name__ == "__main__":
    print(json.dumps({repo_dir: repo(repo_dir) for repo_dir in sys.argv[1:]}))
