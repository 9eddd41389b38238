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
import sys

import weights_manifest
import weights_on_disk


def disk(directory: str) -> dict:
    repo = weights_on_disk.repo(os.path.dirname(directory))  # DIRECTORY itself too, when named by a commit
    entry = repo["entries"].get(directory) or weights_on_disk.directory(directory)
    return weights_manifest.disk_of(entry, weights_manifest.revisions_besides(directory, repo))


def answer(args: dict) -> list[str]:
    """WeightsDisk's lines, for host_state.py."""
    return [json.dumps({directory: disk(directory) for directory in args["local_dirs"]})]


if __name__ == "__main__":
    print(json.dumps({directory: disk(directory) for directory in sys.argv[1:]}))
