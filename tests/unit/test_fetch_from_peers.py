"""The fetcher of a fan-out (host_scripts/fetch_weights.py, weights_sources.py): peers first, the hub last.

Local HTTP servers stand in for the hub and for the peers' servers (each serving files by path, with
Range, as nginx and the hub's CDN do); the fetcher runs as its unit runs it, on temp directories.
"""

import hashlib
import json
import os
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tests.helpers import host_programs_importable

host_programs_importable()
import fetch_weights  # noqa: E402
import weights_manifest  # noqa: E402

REPO_ID, COMMIT = "org/model", "c" * 40
FILES = {"model-00001-of-00002.safetensors": os.urandom(300_000), "model-00002-of-00002.safetensors": os.urandom(200_000),
         "config.json": b'{"model_type": "llama"}'}
TOKEN = "hf_secret_token"
BLOCK = 1 << 16


class Served:
    """What one stand-in server serves, how it misbehaves, and what it was asked."""

    def __init__(self, prefix: str, files: dict[str, bytes]):
        self.prefix, self.files = prefix, dict(files)
        self.corrupt: set[str] = set()  # served with one byte flipped, at the listed size
        self.cut: dict[str, int] = {}  # the connection closes after this many bytes
        self.missing_for: dict[str, int] = {}  # answered 404 this many more times
        self.flood: dict[str, tuple[int, bool]] = {}  # answered with this many bytes (their length said or not)
        self.redirect: dict[str, str] = {}  # answered with a 302 to this URL
        self.asked: list[dict] = []
        self.lock = threading.Lock()


def serve(served: Served):
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_GET(self):
            path = self.path[len(served.prefix):].lstrip("/") if self.path.startswith(served.prefix) else None
            with served.lock:
                served.asked.append({"path": path, "range": self.headers.get("Range"),
                                     "auth": self.headers.get("Authorization")})
                missing = served.missing_for.get(path, 0)
                if missing:
                    served.missing_for[path] = missing - 1
            if path in served.redirect:
                self.send_response(302)
                self.send_header("Location", served.redirect[path])
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            if path in served.flood:
                count, said = served.flood[path]
                self.send_response(200)
                if said:
                    self.send_header("Content-Length", str(count))
                else:
                    self.close_connection = True  # its end is the connection's close: nothing says its length
                self.end_headers()
                try:
                    for _ in range(count // BLOCK):
                        self.wfile.write(bytes(BLOCK))
                except OSError:
                    pass  # the fetcher hung up
                return
            if path not in served.files or missing:
                self.send_error(404)
                return
            data = bytearray(served.files[path])
            if path in served.corrupt:
                data[len(data) // 2] ^= 0xFF
            start = int(self.headers["Range"].split("=")[1].rstrip("-")) if self.headers.get("Range") else 0
            if start >= len(data):
                self.send_error(416)  # as nginx and the hub's CDN answer a Range from a file's end
                return
            self.send_response(206 if start else 200)
            self.send_header("Content-Length", str(len(data) - start))
            self.end_headers()
            body = bytes(data[start:])
            if path in served.cut:
                self.wfile.write(body[:served.cut[path] - start])
                self.wfile.flush()
                self.close_connection = True
                self.connection.shutdown(2)
                return
            self.wfile.write(body)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.fixture
def stand_ins():
    """The hub, and two peers holding the revision (their servers' URLs of it as the controller writes them)."""
    hub = Served(f"/{REPO_ID}/resolve/{COMMIT}/", FILES)
    peers = {name: Served(f"/org--model/{COMMIT}/", FILES) for name in ("gpu1", "gpu2")}
    servers = [serve(hub), *(serve(p) for p in peers.values())]
    yield hub, peers, {name: f"http://127.0.0.1:{s.server_port}" for name, s in zip(peers, servers[1:])}, \
        f"http://127.0.0.1:{servers[0].server_port}"
    for server in servers:
        server.shutdown()
        server.server_close()


def entry(path: str, data: bytes) -> dict:
    lfs = path.endswith(".safetensors")
    return {"path": path, "size": len(data), "sha256": hashlib.sha256(data).hexdigest() if lfs else None,
            "git_sha1": None if lfs else hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()}


def run(tmp_path: Path, monkeypatch, hub_url: str, peer_urls: dict, sources: dict, rounds=None, **extra) -> int:
    monkeypatch.setenv("HF_ENDPOINT", hub_url)
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    monkeypatch.setattr(fetch_weights, "PEER_POLL_S", 0.05)
    spec = {"repo_id": REPO_ID, "commit": COMMIT, "local_dir": str(tmp_path / "weights"),
            "files": [entry(p, d) for p, d in FILES.items()],
            "peers": {name: f"{url}/org--model/{COMMIT}" for name, url in peer_urls.items()},
            "sources": sources, "rounds": rounds or {}, **extra}
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    return fetch_weights.main(str(tmp_path / "spec.json"))


SHARD1, SHARD2 = "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"


def received(tmp_path: Path) -> dict:
    return weights_manifest.read(tmp_path / "weights")["received"]


def in_place(tmp_path: Path) -> bool:
    return all((tmp_path / "weights" / path).read_bytes() == data for path, data in FILES.items())


def test_a_peer_serving_a_wrong_byte_is_caught_by_the_hash_and_the_file_comes_from_the_other(
        stand_ins, tmp_path, monkeypatch, capsys):
    hub, peers, peer_urls, hub_url = stand_ins
    peers["gpu1"].corrupt.add(SHARD1)
    assert run(tmp_path, monkeypatch, hub_url, peer_urls,
               sources={SHARD1: ["gpu1", "gpu2"], SHARD2: ["gpu2"]}, rounds={SHARD1: 2, SHARD2: 1}) == 0
    assert in_place(tmp_path)
    out = capsys.readouterr().out
    assert f"sha256 mismatch for {SHARD1}" in out and "from gpu1: deleted, dropping gpu1" in out
    assert received(tmp_path) == {"hub": len(FILES["config.json"]),
                                  "peers": 2 * len(FILES[SHARD1]) + len(FILES[SHARD2]),
                                  "by_peer": {"gpu1": len(FILES[SHARD1]),
                                              "gpu2": len(FILES[SHARD1]) + len(FILES[SHARD2])}}
    assert [a["path"] for a in hub.asked] == ["config.json"]  # the shards never from the hub
    assert {a["auth"] for p in peers.values() for a in p.asked} == {None}  # no token to a peer
    assert {a["auth"] for a in hub.asked} == {f"Bearer {TOKEN}"}
    assert f"received {len(FILES['config.json'])} bytes from the hub" in out


def test_a_dropped_peer_is_not_asked_again_and_the_hub_serves_what_it_held(stand_ins, tmp_path, monkeypatch):
    hub, peers, peer_urls, hub_url = stand_ins
    peers["gpu1"].corrupt.add(SHARD1)
    # SHARD1 in round 1, SHARD2 in round 2: gpu1 is dropped before SHARD2 is asked of it.
    monkeypatch.setattr(fetch_weights, "STREAMS", 1)
    assert run(tmp_path, monkeypatch, hub_url, peer_urls, sources={SHARD1: ["gpu1"], SHARD2: ["gpu1"]},
               rounds={SHARD1: 1, SHARD2: 2}) == 0
    assert in_place(tmp_path)
    assert [a["path"] for a in peers["gpu1"].asked] == [SHARD1]
    assert sorted(a["path"] for a in hub.asked) == sorted(FILES)
    assert received(tmp_path)["by_peer"] == {"gpu1": len(FILES[SHARD1])}


def test_a_fetch_its_unit_restarts_asks_no_dropped_peer_again_and_adds_to_the_counts(stand_ins, tmp_path,
                                                                                      monkeypatch):
    hub, peers, peer_urls, hub_url = stand_ins
    peers["gpu1"].corrupt.add(SHARD1)
    hub.missing_for[SHARD2] = 1  # the first fetch fails on it (its unit restarts it), the second completes
    sources = {SHARD1: ["gpu1"], SHARD2: ["gpu1"]}
    monkeypatch.setattr(fetch_weights, "STREAMS", 1)
    assert run(tmp_path, monkeypatch, hub_url, peer_urls, sources=sources, rounds={SHARD1: 1, SHARD2: 2}) == 1
    asked_before = len(peers["gpu1"].asked)
    assert run(tmp_path, monkeypatch, hub_url, peer_urls, sources=sources, rounds={SHARD1: 1, SHARD2: 2}) == 0
    assert len(peers["gpu1"].asked) == asked_before == 1 and in_place(tmp_path)
    assert received(tmp_path) == {"hub": sum(len(d) for d in FILES.values()), "peers": len(FILES[SHARD1]),
                                  "by_peer": {"gpu1": len(FILES[SHARD1])}}
    assert not (tmp_path / "weights" / ".cache/specfleet/sources.json").exists()  # gone with the journal


def test_a_peer_that_breaks_off_is_continued_by_the_hub_from_the_bytes_already_here(stand_ins, tmp_path, monkeypatch):
    hub, peers, peer_urls, hub_url = stand_ins
    peers["gpu1"].cut[SHARD1] = 120_000
    assert run(tmp_path, monkeypatch, hub_url, peer_urls, sources={SHARD1: ["gpu1"]}) == 0
    assert in_place(tmp_path)
    assert [(a["path"], a["range"]) for a in hub.asked if a["path"] == SHARD1] == [(SHARD1, "bytes=120000-")]
    counts = received(tmp_path)
    assert counts["by_peer"] == {"gpu1": 120_000}
    assert counts["hub"] == len(FILES[SHARD1]) - 120_000 + len(FILES[SHARD2]) + len(FILES["config.json"])


def test_a_part_left_whole_by_a_kill_is_fetched_again_not_asked_past_its_end(stand_ins, tmp_path, monkeypatch):
    """Killed after its last byte arrived, before its hash was checked: a Range from its end would be refused
    (416) by every source, the peer dropped for it and the hub failing the unit on every restart."""
    hub, peers, peer_urls, hub_url = stand_ins
    part = tmp_path / "weights" / fetch_weights.PARTS / f"{SHARD1}.part"
    part.parent.mkdir(parents=True)
    part.write_bytes(FILES[SHARD1])
    assert run(tmp_path, monkeypatch, hub_url, peer_urls, sources={SHARD1: ["gpu1"]}) == 0
    assert [(a["path"], a["range"]) for a in peers["gpu1"].asked] == [(SHARD1, None)] and in_place(tmp_path)


def test_a_peer_that_has_not_the_file_yet_is_waited_on_then_serves_it(stand_ins, tmp_path, monkeypatch):
    hub, peers, peer_urls, hub_url = stand_ins
    peers["gpu1"].missing_for[SHARD1] = 3  # it is still fetching it from its own source
    assert run(tmp_path, monkeypatch, hub_url, peer_urls, sources={SHARD1: ["gpu1"]}) == 0
    assert [a["path"] for a in peers["gpu1"].asked] == [SHARD1] * 4
    assert SHARD1 not in [a["path"] for a in hub.asked] and in_place(tmp_path)


def test_a_peer_that_never_has_it_or_cannot_be_reached_leaves_the_file_to_the_hub(stand_ins, tmp_path, monkeypatch,
                                                                                   capsys):
    hub, peers, peer_urls, hub_url = stand_ins
    peers["gpu1"].missing_for[SHARD1] = 10_000
    closed = {"gpu1": peer_urls["gpu1"], "gpu2": "http://127.0.0.1:9"}  # the discard port: nothing listens
    assert run(tmp_path, monkeypatch, hub_url, closed, sources={SHARD1: ["gpu1"], SHARD2: ["gpu2"]},
               peer_wait_s=0.3) == 0
    assert in_place(tmp_path) and sorted(a["path"] for a in hub.asked) == sorted(FILES)
    out = capsys.readouterr().out
    assert "dropping peer gpu1 (it did not have" in out and "dropping peer gpu2 (URLError" in out
    assert received(tmp_path)["peers"] == 0


@pytest.mark.parametrize("length_said", [True, False], ids=["its length said", "streamed to its close"])
def test_a_peer_answering_more_than_the_listed_size_is_refused_and_none_of_it_is_kept(
        stand_ins, tmp_path, monkeypatch, capsys, length_said):
    """Whatever answers on a peer's address (a process that took the port once nginx stopped) streams 16 MiB
    for a file the hub lists at its own size; the hub does not have it yet, so the fetch fails: nothing of
    the peer's answer is on disk, not even the listed size of it."""
    hub, peers, peer_urls, hub_url = stand_ins
    peers["gpu1"].flood[SHARD1] = (16 << 20, length_said)
    hub.missing_for[SHARD1] = 1
    assert run(tmp_path, monkeypatch, hub_url, peer_urls, sources={SHARD1: ["gpu1"]}) == 1
    part = tmp_path / "weights" / fetch_weights.PARTS / f"{SHARD1}.part"
    assert not part.exists() or part.stat().st_size == 0
    assert not (tmp_path / "weights" / SHARD1).exists()
    written = sum(f.stat().st_size for f in (tmp_path / "weights").rglob("*") if f.is_file())
    others = len(FILES[SHARD2]) + len(FILES["config.json"])
    assert others <= written < others + 4096, written  # the other files, the journal and the counts: no flood
    assert "dropping peer gpu1 (Oversized: it a" in capsys.readouterr().out
    # The hub has it on the unit's restart: the peer dropped is not asked again.
    assert run(tmp_path, monkeypatch, hub_url, peer_urls, sources={SHARD1: ["gpu1"]}) == 0 and in_place(tmp_path)
    assert len(peers["gpu1"].asked) == 1


def test_a_peers_redirect_is_not_followed(stand_ins, tmp_path, monkeypatch, capsys):
    """A peer's address answering 302 to another URL (an internal service the host reaches): that URL is never
    asked, the peer is dropped and the hub serves the file."""
    hub, peers, peer_urls, hub_url = stand_ins
    elsewhere = Served("/", {"internal": b"x"})
    target = serve(elsewhere)
    try:
        peers["gpu1"].redirect[SHARD1] = f"http://127.0.0.1:{target.server_port}/internal"
        assert run(tmp_path, monkeypatch, hub_url, peer_urls, sources={SHARD1: ["gpu1"]}) == 0
    finally:
        target.shutdown()
        target.server_close()
    assert elsewhere.asked == [] and in_place(tmp_path)
    assert "dropping peer gpu1 (HTTP 302)" in capsys.readouterr().out
    assert SHARD1 in [a["path"] for a in hub.asked]


def test_files_the_hub_lists_without_a_sha256_come_from_the_hub_alone(stand_ins, tmp_path, monkeypatch):
    """config.json (and a model's code, run with --trust-remote-code) is checked by git's blob SHA-1 only: a
    spec naming a peer for it does not make the fetcher ask that peer."""
    hub, peers, peer_urls, hub_url = stand_ins
    assert run(tmp_path, monkeypatch, hub_url, peer_urls,
               sources={"config.json": ["gpu1"], SHARD1: ["gpu1"]}) == 0 and in_place(tmp_path)
    assert [a["path"] for a in peers["gpu1"].asked] == [SHARD1]
    assert "config.json" in [a["path"] for a in hub.asked]


@pytest.mark.parametrize("peers, sources, problem", [
    ({"gpu1": "http://10.0.0.1:30900/org--model/" + "d" * 40}, {}, "is not a peer server's URL of"),
    ({"gpu1": "http://10.0.0.1:30900/x/" + COMMIT + "?a=b"}, {}, "is not a peer server's URL of"),
    ({"gpu1": "file:///etc/passwd"}, {}, "is not a peer server's URL of"),
    ({"hub": "http://10.0.0.1:30900/org--model/" + COMMIT}, {}, "is not a host name"),
    ({}, {SHARD1: ["gpu9"]}, "name a peer the spec does not hold"),
])
def test_a_spec_naming_peers_wrongly_is_refused_before_anything_is_fetched(tmp_path, monkeypatch, capsys, peers,
                                                                           sources, problem):
    spec = {"repo_id": REPO_ID, "commit": COMMIT, "local_dir": str(tmp_path / "weights"),
            "files": [entry(p, d) for p, d in FILES.items()], "peers": peers, "sources": sources}
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    assert fetch_weights.main(str(tmp_path / "spec.json")) == 1
    assert problem in capsys.readouterr().err
    assert list((tmp_path / "weights").iterdir()) == []
