"""Runs ON THE HOST (sent inline, as root, at preflight): room for each weights directory.

Usage: weights_disk.py DIRECTORY...  Prints JSON, per directory: free bytes on the filesystem
that will hold it (its nearest existing ancestor), that filesystem's device, the ancestor
checked, and the sizes of the files already there; what is missing is computed on the
controller against the hub's file list.

    {"/srv/specfleet/models/moonshotai--Kimi-K2.6":
        {"free": 636707266560, "device": 2049, "checked": "/srv", "files": {"config.json": 3512}}}
"""

import json
import os
import sys


def disk(directory: str) -> dict:
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
    return {"free": st.f_bavail * st.f_frsize, "device": os.stat(probe).st_dev, "checked": probe, "files": files}


def answer(args: dict) -> list[str]:
    """WeightsDisk's lines, for host_state.py."""
    return [json.dumps({directory: disk(directory) for directory in args["local_dirs"]})]


if __name__ == "__main__":
    print(json.dumps({directory: disk(directory) for directory in sys.argv[1:]}))
