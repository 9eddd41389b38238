"""Runs ON THE HOST (sent inline, as the download user, who owns the weights): files whose content differs from the hub's.

Usage: verify_weights.py DIRECTORY LISTING, where LISTING is the controller's validated JSON
listing (path, size, sha256 or git_sha1; see weights_manifest). Prints the JSON list of paths
whose bytes do not hash to the hub's value (sha256 for LFS files, git's blob sha1 otherwise),
are missing, or resolve outside DIRECTORY. Reads every byte.
"""

import json
import sys

import weights_manifest


def corrupt(directory: str, listing: list[dict]) -> list[str]:
    bad = []
    for entry in listing:
        try:
            ok = weights_manifest.hash_file(weights_manifest.inside(directory, entry["path"]), entry) \
                == weights_manifest.expected_digest(entry)
        except (OSError, ValueError):
            ok = False
        if not ok:
            bad.append(entry["path"])
    return bad


if __name__ == "__main__":
    print(json.dumps(corrupt(sys.argv[1], json.loads(sys.argv[2]))))
