"""Runs ON THE HOST (sent inline, as root, at preflight): room for each weights directory.

Usage: weights_disk.py DIRECTORY...  Prints JSON, per directory (a revision's): free bytes on the
filesystem that will hold it (its nearest existing ancestor), that filesystem's device, the
ancestor checked, the sizes of the files already there, and the content the repo's other revisions
hold (`others`: "sha256:HEX:SIZE" or "git_sha1:HEX:SIZE", as their manifests recorded files still
on disk), which the fetcher links instead of fetching; what is missing is computed on the
controller against the hub's file list.

    {"/srv/specfleet/models/moonshotai--Kimi-K2.6/3f2a...":
        {"free": 636707266560, "device": 2049, "checked": "/srv", "files": {"config.json": 3512},
         "others": ["sha256:9a0b...:9825000000"]}}

A revision directory that is a link (the service user owns the repo directory that holds it, and may
swap one in) is not walked: root would list whatever it points at, `/` included. It is answered as
{"linked": true}, which preflight refuses.
"""

import json
import os
import stat
import sys

import weights_manifest
import weights_revisions


def held_elsewhere(directory: str) -> list[str]:
    """What the other revisions of DIRECTORY's repo hold, by content."""
    repo_dir = os.path.dirname(directory)
    found = set()
    for other in weights_revisions.revision_dirs(repo_dir):
        if other == directory:
            continue
        manifest = weights_manifest.read(other) or {}
        files = manifest.get("files") if isinstance(manifest.get("files"), dict) else {}
        for path, record in files.items():
            if not isinstance(record, dict):
                continue
            kind = "sha256" if record.get("sha256") else "git_sha1"
            if weights_manifest.path_problem(path):
                continue
            full = os.path.join(other, path)
            inside = os.path.normpath(os.path.join(os.path.realpath(other), os.path.dirname(path)))
            if os.path.realpath(os.path.dirname(full)) != inside:
                continue  # a linked directory on its way: root looks only inside the revision
            try:  # the file itself, as root: a link the service user planted is not followed
                st = os.lstat(full)
            except OSError:
                continue
            if stat.S_ISREG(st.st_mode) and st.st_size == record.get("size"):
                found.add(f"{kind}:{record.get(kind)}:{record.get('size')}")
    return sorted(found)


def disk(directory: str) -> dict:
    if os.path.islink(directory):
        return {"linked": True}
    probe = directory
    while not os.path.exists(probe):
        probe = os.path.dirname(probe)
    st = os.statvfs(probe)
    files = {}
    for root, dirs, names in os.walk(directory):
        dirs[:] = [x for x in dirs if x != ".cache"]
        for name in names:
            full = os.path.join(root, name)
            # Its own size: a link the service user planted there is not followed by root.
            files[os.path.relpath(full, directory)] = os.lstat(full).st_size
    return {"free": st.f_bavail * st.f_frsize, "device": os.stat(probe).st_dev, "checked": probe, "files": files,
            "others": held_elsewhere(directory)}


def answer(args: dict) -> list[str]:
    """WeightsDisk's lines, for host_state.py."""
    return [json.dumps({directory: disk(directory) for directory in args["local_dirs"]})]


if __name__ == "__main__":
    print(json.dumps({directory: disk(directory) for directory in sys.argv[1:]}))
