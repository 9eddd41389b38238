"""Runs ON THE HOST (sent inline, as root: it only reads): what each weights directory's fetcher took from
the hub and from peers (its manifest's `received`, weights_manifest.write), for the run's table.

Usage: weights_received.py DIRECTORY..., each a weights directory the controller named. Prints JSON, per
directory the manifest's `received` ({"hub": bytes, "peers": bytes, ...}) or None (no manifest, or one
without it). The manifest is read as weights_state.py reads it: no link followed, no FIFO waited on.
"""

import json
import sys

import weights_manifest


def main(directories: list[str]) -> dict:
    return {directory: (weights_manifest.read(directory) or {}).get("received") for directory in directories}


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1:])))
