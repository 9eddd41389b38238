"""Runs ON THE HOST (sent inline, as root: it only reads): how complete each weights directory is.

Usage: weights_state.py LISTINGS, where LISTINGS is JSON {directory: {path: size}}, the hub's
files as the controller validated them. Prints JSON, per directory None (no manifest: not
complete) or the manifest's commit and the listed files whose size on disk differs or that the
manifest does not record:

    {"/srv/specfleet/models/moonshotai--Kimi-K2.6": {"commit": "3f2a...", "bad": ["model-00007-of-00064.safetensors"]},
     "/srv/specfleet/models/z-lab--Kimi-K2.6-DFlash": None}

It stats files and reads no content, so a re-run over 600 GB takes as long as over 6 MB. A file counts
only as a regular file reached through no link below DIRECTORY (root stats in a directory the service user
owns: it looks at nothing outside it), and a DIRECTORY that is a link reads as incomplete.
"""

import json
import sys

import weights_manifest
import weights_on_disk


def main(listings: dict[str, dict[str, int]]) -> dict:
    return {directory: weights_manifest.state_of(weights_on_disk.directory(directory), sizes)
            for directory, sizes in listings.items()}


def answer(args: dict) -> list[str]:
    """WeightsState's lines, for host_state.py."""
    return [json.dumps(main(json.loads(args["listings"])))]


if __name__ == "__main__":
    print(json.dumps(main(json.loads(sys.argv[1]))))
