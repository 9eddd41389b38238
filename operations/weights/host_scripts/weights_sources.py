"""Runs ON THE HOST, in the fetcher (fetch_weights.py): where each file of a revision comes from.

A spec of the fan-out (operations/weights/fanout.py) names the run's peers that hold the revision,
each at its peer server's URL of it, and per file the peers to ask, in order; the hub comes last,
for every file, and is the only source of a file the hub lists without a sha256. A peer that serves a byte the hub's hash refuses, or that cannot be reached, is
dropped for the rest of the fetch, and the file comes from the next source. The peers dropped and the
bytes received by source (the hub, each peer) are kept beside the journal, so a fetch its unit restarts
asks no dropped peer again and adds to the counts; the manifest records their sum.

Standard library only.
"""

import json
import os
import re
import threading
from pathlib import Path

import weights_manifest

HUB = "hub"  # fanout.HUB on the controller
# A peer server's URL of a revision, as the controller writes it (fanout.peer_url): nothing else is fetched.
PEER_URL = re.compile(r"http://[A-Za-z0-9][A-Za-z0-9.-]*:[0-9]{1,5}/[A-Za-z0-9][A-Za-z0-9._-]*/"
                      + weights_manifest.COMMIT.pattern)
PEER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@-]{0,252}")
KEPT = ".cache/specfleet/sources.json"  # {"received": {source: bytes}, "dropped": {peer: why}}


def spec_problem(spec: dict) -> str | None:
    """Why the spec's peers and sources may not be used; None when they may (or the spec has none)."""
    peers = spec.get("peers") or {}
    if not isinstance(peers, dict):
        return "peers is not a mapping"
    for name, url in peers.items():
        if not isinstance(name, str) or not PEER_NAME.fullmatch(name) or name == HUB:
            return f"peer name {name!r} is not a host name"
        if not isinstance(url, str) or not PEER_URL.fullmatch(url) or not url.endswith("/" + spec["commit"]):
            return f"peer {name}'s URL {url!r} is not a peer server's URL of {spec['commit']}"
    sources = spec.get("sources") or {}
    if not isinstance(sources, dict):
        return "sources is not a mapping"
    for path, names in sources.items():
        if not isinstance(names, list) or any(n not in peers for n in names):
            return f"the sources of {path!r} name a peer the spec does not hold"
    return None


class Sources:
    """The fetch's sources: the peers not dropped, and the bytes received from each source."""

    def __init__(self, spec: dict, local_dir: Path):
        self.peers = dict(spec.get("peers") or {})
        # A file the hub lists without a sha256 is checked by git's blob SHA-1 alone, a hash a peer that chose
        # its bytes could collide (SHAttered): those small files (config.json, tokenizer files, the model's
        # code that --trust-remote-code runs) come from the hub alone, whatever the spec says.
        lfs = {entry["path"] for entry in spec.get("files") or () if entry.get("sha256")}
        self.order = {path: list(names) for path, names in (spec.get("sources") or {}).items() if path in lfs}
        self.lock = threading.Lock()
        self.file = Path(weights_manifest.inside(local_dir, KEPT))
        try:
            earlier = json.loads(self.file.read_text())
        except (OSError, ValueError):
            earlier = {}
        earlier = earlier if isinstance(earlier, dict) else {}
        received, dropped = earlier.get("received"), earlier.get("dropped")
        self.received = {name: count for name, count in (received if isinstance(received, dict) else {}).items()
                         if isinstance(name, str) and isinstance(count, int) and count >= 0}
        self.dropped = {name: str(why) for name, why in (dropped if isinstance(dropped, dict) else {}).items()
                        if name in self.peers}  # peer -> why

    def of(self, path: str) -> list[str]:
        """The sources to ask for PATH, in order: its peers not dropped, then the hub."""
        with self.lock:
            return [name for name in self.order.get(path, []) if name not in self.dropped] + [HUB]

    def url(self, name: str, quoted_path: str) -> str:
        return f"{self.peers[name]}/{quoted_path}"

    def drop(self, name: str, why: str) -> bool:
        """Drop peer NAME for the rest of the fetch; whether it was not dropped before."""
        with self.lock:
            if name in self.dropped:
                return False
            self.dropped[name] = why
            return True

    def count(self, name: str, size: int) -> None:
        with self.lock:
            self.received[name] = self.received.get(name, 0) + size

    def keep(self) -> None:
        """The counts and the peers dropped beside the journal, where a restarted fetch finds them."""
        self.file.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.file.with_name(f".{self.file.name}.tmp")
        with self.lock:
            tmp.write_text(json.dumps({"received": self.received, "dropped": self.dropped}, sort_keys=True))
        os.replace(tmp, self.file)

    def done(self) -> None:
        self.file.unlink(missing_ok=True)

    def summary(self) -> dict:
        """The bytes received, from the hub and from the peers, each peer's: what the manifest records."""
        with self.lock:
            peers = {name: count for name, count in sorted(self.received.items()) if name != HUB}
            return {"hub": self.received.get(HUB, 0), "peers": sum(peers.values()), "by_peer": peers}

    def line(self) -> str:
        s = self.summary()
        by_peer = ", ".join(f"{name} {count}" for name, count in s["by_peer"].items())
        return f"received {s['hub']} bytes from the hub, {s['peers']} from peers" + (f" ({by_peer})" if by_peer else "")
