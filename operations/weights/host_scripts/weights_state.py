"""Runs ON THE HOST (sent inline, as root: it only reads): how complete each weights directory is.

Usage: weights_state.py LISTINGS, where LISTINGS is JSON {directory: {path: size}}, the hub's
files as the controller validated them. Prints JSON, per directory None (no manifest: not
complete) or the manifest's commit and the listed files whose size on disk differs or that the
manifest does not record:

    {"/srv/specfleet/models/moonshotai--Kimi-K2.6": {"commit": "3f2a...", "bad": ["model-00007-of-00064.safetensors"]},
     "/srv/specfleet/models/z-lab--Kimi-K2.6-DFlash": None}

It stats files and reads no content, so a re-run over 600 GB takes as long as over 6 MB.
"""

import json
import os
import stat
import sys

import weights_manifest


def size_or_none(directory: str, path: str) -> int | None:
    """The size of the regular file DIRECTORY/PATH; None when absent, not a regular file, or reached
    through a link below DIRECTORY (root stats in a directory the service user owns: it looks at
    nothing outside it)."""
    full = os.path.join(directory, path)
    try:
        if os.path.realpath(full) != os.path.join(os.path.realpath(directory), path):
            return None
        info = os.lstat(full)
    except OSError:
        return None
    return info.st_size if stat.S_ISREG(info.st_mode) else None


def state(directory: str, sizes: dict[str, int]) -> dict | None:
    manifest = weights_manifest.read(directory)
    if manifest is None:
        return None
    recorded = manifest.get("files") if isinstance(manifest.get("files"), dict) else {}
    # A listed file the manifest does not record (an edited or older manifest) is fetched again too.
    bad = [path for path, size in sizes.items()
           if path not in recorded or size_or_none(directory, path) != size]
    return {"commit": manifest.get("commit"), "bad": bad}


def main(listings: dict[str, dict[str, int]]) -> dict:
    return {directory: state(directory, sizes) for directory, sizes in listings.items()}


def answer(args: dict) -> list[str]:
    """WeightsState's lines, for host_state.py."""
    return [json.dumps(main(json.loads(args["listings"])))]


if __name__ == "__main__":
    print(json.dumps(main(json.loads(sys.argv[1]))))
