"""Runs ON THE HOST, as the download unit: fetch one pinned repo into its directory.

Usage: fetch_weights.py SPEC.json, where SPEC holds repo_id, commit, local_dir (this
revision's directory), revisions_dir (the repo's, holding its other revisions) and the hub's
listing as the controller validated it (weights_manifest.py). The token comes from the
environment or HF_HOME's token file, never from arguments.

Every file name is checked again here, before anything is written: it must be a safe
relative name that resolves inside local_dir.

Standard library only, so the unit is one short Python start. huggingface_hub is not used
here: it does not resume a partial file after its process dies (its temporary names are
unique per process, and it writes in 10 MiB blocks) and over plain HTTP it checks sizes
only. Instead every file streams into `.cache/specfleet/parts/<path>.part`, up to 8 at a
time (huggingface_hub's own default), largest first; an interrupted one continues with an
HTTP Range request from the bytes already on disk. Each is hashed as its bytes arrive (a
resumed file's bytes on disk first): sha256 for LFS files, git's blob sha1 for the others,
as the hub lists them. A file whose hash differs from the hub's is deleted and fetched
again, never put in place; only when every file is in place with the hub's size and hash
is the manifest written that marks the repo complete.

A file already on disk is in place only when its size is the listing's and, for an LFS file,
the directory's manifest (or the journal of files put in place since the fetch began,
`.cache/specfleet/placed.jsonl`) recorded the listing's sha256 for it: a file of the right size
under any other record is hashed first. A new commit whose retrained shards keep their names
and sizes therefore never keeps the old bytes under a manifest naming the new commit.

A file that another revision of the repo holds, as its manifest recorded it with the listing's
hash and size (revisions_dir/<commit>/, or revisions_dir itself for the single directory of
earlier specfleet versions), is hard-linked into place instead of fetched: the new revision
costs the disk only the files that changed, and the old one keeps its own bytes.

In a fan-out (operations/weights/fanout.py) the spec also names the run's peers holding the
revision and, per file, the peers to ask first and the round in which the plan has it here; the
files are fetched round by round (a peer is waited on only for a file it has in an earlier round),
and each from its first source that serves it whole with the hub's hash (weights_sources.py). A
peer gets no token, and one that serves a wrong byte or cannot be reached is dropped; bytes it
served that are not yet proven wrong stay, and the next source continues them with a Range request.
Whatever answers on a peer's address is not trusted further than the hub's listing: no answer is written
past the file's listed size (one longer is refused and its bytes truncated away, so it cannot fill the
disk), and a peer's redirect is never followed (it could point the fetcher anywhere its host reaches).
Files the hub lists without a sha256 (config.json, the tokenizer's, a model's own code) come from the hub
alone: git's blob SHA-1 is no defence against a peer that chose its bytes.
"""

import functools
import http.client
import json
import os
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import weights_manifest
import weights_sources
from weights_sources import HUB, Sources

PARTS = ".cache/specfleet/parts"
# Files put in place (or proven by their hash) since the manifest was removed, one JSON listing
# entry a line: a resumed fetch trusts them as it trusts the manifest, and hashes nothing twice.
PLACED = ".cache/specfleet/placed.jsonl"
BLOCK = 1 << 20  # most bytes read, hashed and written per step
STREAMS = 8  # files in flight at once, as huggingface_hub's max_workers
ATTEMPTS = 2  # transfers per file whose bytes hash wrong, before the unit fails (and restarts)
# A peer is on the run's own network: one silent this long is not coming. One that has not yet put a file
# in place answers 404, asked again every PEER_POLL_S up to the spec's peer_wait_s (it may be fetching it
# from its own source: a round of the largest shards at the hub's rate).
PEER_TIMEOUT_S = 15
PEER_POLL_S = 2.0
PEER_WAIT_S = 1800
# Left in a weights directory by specfleet versions that fetched through huggingface_hub.
STALE = ".cache/huggingface/download"


class HashMismatch(Exception):
    """A file's bytes do not hash to the hub's value: never to be put in place."""


def hub_token() -> str | None:
    """The token where huggingface_hub looks for it: HF_TOKEN, else the file HF_TOKEN_PATH or HF_HOME/token."""
    if os.environ.get("HF_TOKEN"):
        return os.environ["HF_TOKEN"]
    home = os.environ.get("HF_HOME") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "huggingface")
    try:
        with open(os.environ.get("HF_TOKEN_PATH") or os.path.join(home, "token")) as f:
            return f.read().strip() or None
    except FileNotFoundError:
        return None


def resolve_url(spec: dict, path: str) -> str:
    """The hub's download URL of PATH at the pinned commit (huggingface_hub's hf_hub_url)."""
    endpoint = (os.environ.get("HF_ENDPOINT") or "https://huggingface.co").rstrip("/")
    return f"{endpoint}/{spec['repo_id']}/resolve/{spec['commit']}/{urllib.parse.quote(path)}"


class PeerFailed(Exception):
    """A peer did not serve a file: it is dropped, the file comes from the next source."""


class Oversized(OSError):
    """A source answered more bytes than the hub lists for the file: none of that answer is kept."""


class NoRedirect(urllib.request.HTTPRedirectHandler):
    """A peer's answer is the file or nothing: a redirect from whatever answers on a peer's address would send
    the fetcher to any URL its host reaches (an internal service), so it fails as the 3xx it is."""

    def redirect_request(self, *args, **kwargs):
        return None


PEER_OPENER = urllib.request.build_opener(NoRedirect)


def transfer(url: str, token: str | None, part: Path, size: int, digest, tally=None, timeout: float = 60,
             opener=urllib.request.urlopen) -> int:
    """Append the rest of URL to PART (from its current size), hashing every byte of PART into
    DIGEST and counting each byte received with TALLY; returns the byte it resumed at. An answer longer
    than the SIZE listed raises Oversized, with PART as it was before it (at most SIZE bytes are ever on disk)."""
    done = part.stat().st_size if part.exists() else 0
    if done >= size:  # nothing left to ask for (a Range from its end is refused, 416): fetched again whole
        part.unlink()
        done = 0
    request = urllib.request.Request(url, headers={"Range": f"bytes={done}-"} if done else {})
    if token:
        # Not sent on to the redirect: LFS content comes from a signed CDN URL that refuses it.
        request.add_unredirected_header("Authorization", f"Bearer {token}")
    with opener(request, timeout=timeout) as response:
        start = done if response.status == 206 else 0  # a server that ignored the Range sends it all: start over
        left = size - start
        length = response.headers.get("Content-Length", "")
        if length.isdigit() and int(length) > left:
            raise Oversized(f"it answers {length} bytes where {left} are left of the {size} listed")
        with part.open("ab") as out:
            if start != done:
                out.truncate(0)
            if start:  # the bytes already on disk are hashed first
                with part.open("rb") as prefix:
                    for block in iter(lambda: prefix.read(1 << 22), b""):
                        digest.update(block)
            # read1: what has arrived, up to BLOCK, written at once, so a kill loses only what was in flight
            # (readinto would hold up to BLOCK of received bytes per file until its buffer is full).
            while left:
                block = response.read1(min(BLOCK, left))
                if not block:
                    break
                out.write(block)
                out.flush()
                digest.update(block)
                left -= len(block)
                if tally:
                    tally(len(block))
            if not left and response.read1(1):
                out.truncate(start)
                raise Oversized(f"it answered more than the {size} bytes listed")
    return start


class Placed:
    """What this directory's files were proven to hold: the manifest's records, then the journal's."""

    def __init__(self, local_dir: Path):
        self.journal = Path(weights_manifest.inside(local_dir, PLACED))
        manifest = weights_manifest.read(local_dir) or {}
        files = manifest.get("files") if isinstance(manifest.get("files"), dict) else {}
        self.records = {path: {**record, "path": path} for path, record in files.items() if isinstance(record, dict)}
        try:
            lines = self.journal.read_text().splitlines()
        except OSError:
            lines = []
        for line in lines:
            try:
                record = json.loads(line)
                self.records[record["path"]] = record
            except (ValueError, KeyError, TypeError):
                continue  # a line cut by a kill: that file is hashed again
        self.lock = threading.Lock()

    def keep(self) -> None:
        """Carry the records over into the journal, before the manifest goes."""
        self.journal.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.journal.with_name(f".{self.journal.name}.tmp")
        tmp.write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in self.records.values()))
        os.replace(tmp, self.journal)

    def add(self, entry: dict) -> None:
        record = {k: entry.get(k) for k in ("path", "size", "sha256", "git_sha1")}
        with self.lock, self.journal.open("a") as journal:
            journal.write(json.dumps(record, sort_keys=True) + "\n")
            self.records[entry["path"]] = record

    def proves(self, entry: dict) -> bool:
        """The file at ENTRY's path was put in place as ENTRY's LFS content (same sha256 and size)."""
        was = self.records.get(entry["path"]) or {}
        return bool(entry.get("sha256")) and (was.get("sha256"), was.get("size")) == (entry["sha256"], entry["size"])

    def done(self) -> None:
        self.journal.unlink(missing_ok=True)


def in_place(entry: dict, final: Path, placed: Placed) -> bool:
    """Whether FINAL already holds ENTRY: of the hub's size and, for an LFS file, recorded with the hub's
    sha256 when it was put in place (verify_weights hashes it again); anything else is hashed."""
    if not (final.is_file() and final.stat().st_size == entry["size"]):
        return False
    if placed.proves(entry):
        return True
    if weights_manifest.hash_file(final, entry) != weights_manifest.expected_digest(entry):
        return False
    placed.add(entry)
    return True


def digest_key(entry: dict) -> tuple[str, str, int]:
    """What a file's content is known as: its hub hash (sha256 for LFS files, else git's blob id) and size."""
    return ("sha256", entry["sha256"], entry["size"]) if entry.get("sha256") else \
        ("git_sha1", entry.get("git_sha1"), entry["size"])


def other_revisions(spec: dict, local_dir: Path) -> dict[tuple, Path]:
    """The files the repo's other revisions hold, by content (``digest_key``), as their manifests recorded
    them: each an existing file of the recorded size inside its own revision's directory."""
    revisions_dir = spec.get("revisions_dir")
    if not revisions_dir:
        return {}
    found: dict[tuple, Path] = {}
    for directory in [Path(revisions_dir), *sorted(Path(revisions_dir).iterdir() if Path(revisions_dir).is_dir() else [])]:
        if not directory.is_dir() or directory.resolve() == local_dir.resolve():
            continue
        manifest = weights_manifest.read(directory) or {}
        files = manifest.get("files") if isinstance(manifest.get("files"), dict) else {}
        for path, record in files.items():
            if not isinstance(record, dict) or weights_manifest.entry_problem({"path": path, **record}):
                continue
            try:
                source = Path(weights_manifest.inside(directory, path))
            except ValueError:
                continue
            if source.is_file() and source.stat().st_size == record["size"]:
                found.setdefault(digest_key(record), source)
    return found


def linked(entry: dict, final: Path, local_dir: Path, sources: dict[tuple, Path], placed: Placed) -> str:
    """Link ENTRY into place from another revision that recorded its content; what happened, or ''."""
    source = sources.get(digest_key(entry))
    if source is None:
        return ""
    step = Path(weights_manifest.inside(local_dir, f"{PARTS}/{entry['path']}.link"))
    step.parent.mkdir(parents=True, exist_ok=True)
    step.unlink(missing_ok=True)
    try:
        os.link(source, step)
    except OSError as error:  # another filesystem, or a protected link: fetched instead
        return f"could not link {entry['path']} from {source.parent} ({error.strerror}): fetching it"
    final.parent.mkdir(parents=True, exist_ok=True)
    os.replace(step, final)
    placed.add(entry)
    return f"linked {entry['path']} from {source.parent.name} (its manifest recorded the same hash)"


def from_source(source: str, spec: dict, entry: dict, part: Path, token: str | None, digest,
                sources: Sources) -> int:
    """Continue PART from SOURCE (the hub, with the token; a peer, without it, waited on while it answers
    that it has not the file yet); returns the byte it resumed at. A peer's failure raises PeerFailed."""
    tally = functools.partial(sources.count, source)
    if source == HUB:
        return transfer(resolve_url(spec, entry["path"]), token, part, entry["size"], digest, tally)
    deadline = time.monotonic() + spec.get("peer_wait_s", PEER_WAIT_S)
    while True:
        try:
            return transfer(sources.url(source, urllib.parse.quote(entry["path"])), None, part, entry["size"],
                            digest, tally, timeout=PEER_TIMEOUT_S, opener=PEER_OPENER.open)
        except urllib.error.HTTPError as error:
            if error.code != 404:
                raise PeerFailed(f"HTTP {error.code}") from None
            if time.monotonic() >= deadline:
                raise PeerFailed(f"it did not have {entry['path']} within {spec.get('peer_wait_s', PEER_WAIT_S)} s") \
                    from None
            time.sleep(PEER_POLL_S)  # nothing was hashed: the answer came before the part's bytes are read
        except (OSError, http.client.HTTPException) as error:
            raise PeerFailed(f"{type(error).__name__}: {error}") from None


def fetch_resumable(spec: dict, entry: dict, local_dir: Path, token: str | None, placed: Placed,
                    linkable: dict[tuple, Path] | None = None, sources: Sources | None = None) -> str:
    """Fetch one file into place from its sources (the spec's, unless given), continuing its .part file (or
    link it from another revision that holds it); what happened, for the journal."""
    sources = sources or Sources(spec, local_dir)
    final = Path(weights_manifest.inside(local_dir, entry["path"]))
    if in_place(entry, final, placed):
        return ""
    note = linked(entry, final, local_dir, linkable or {}, placed)
    if note.startswith("linked"):
        return note
    if note:
        print(note, flush=True)
    part = Path(weights_manifest.inside(local_dir, f"{PARTS}/{entry['path']}.part"))
    part.parent.mkdir(parents=True, exist_ok=True)
    kind = "sha256" if entry.get("sha256") else "git sha1"
    notes, hub_attempts, served = [], 0, set()  # served: the sources whose bytes the part holds
    while True:
        source = sources.of(entry["path"])[0]
        digest = weights_manifest.digest_for(entry)
        try:
            resumed_at = from_source(source, spec, entry, part, token, digest, sources)
        except PeerFailed as error:
            served.add(source)  # what it sent stays: the next source continues it, the whole file's hash checks it
            if sources.drop(source, str(error)):
                print(f"dropping peer {source} ({error}): {entry['path']} from the next source", flush=True)
            continue
        served.add(source)
        if part.stat().st_size != entry["size"]:
            if source == HUB:
                raise OSError(f"{entry['path']}: {part.stat().st_size} bytes after the transfer, "
                              f"{entry['size']} expected")
            sources.drop(source, "served a file of the wrong size")
            print(f"dropping peer {source} (it served {part.stat().st_size} bytes of {entry['path']}, the hub lists "
                  f"{entry['size']}): the next source continues it", flush=True)
            continue
        if digest.hexdigest() == weights_manifest.expected_digest(entry):
            break
        part.unlink()
        peers = sorted(served - {HUB})
        notes.append(f"{kind} mismatch for {entry['path']} (got {digest.hexdigest()}, the hub lists "
                     f"{weights_manifest.expected_digest(entry)}) from {', '.join(sorted(served))}: deleted")
        served = set()
        for peer in peers:
            sources.drop(peer, f"served bytes of {entry['path']} that the hub's hash refuses")
        if peers:
            notes[-1] += f", dropping {', '.join(peers)}"
        else:
            hub_attempts += 1
        print(notes[-1] + (", fetching it again" if hub_attempts < ATTEMPTS else ""), flush=True)
        if hub_attempts >= ATTEMPTS:
            raise HashMismatch("; ".join(notes))
    final.parent.mkdir(parents=True, exist_ok=True)
    os.replace(part, final)
    placed.add(entry)
    via = "" if served == {HUB} else f" from {', '.join(sorted(served))}"
    return (f"resumed {entry['path']} at byte {resumed_at}" if resumed_at else f"fetched {entry['path']}") \
        + f"{via} ({kind} checked)"


def fetch_all(spec: dict, local_dir: Path, placed: Placed, sources: Sources) -> list[str]:
    """Every listed file into place, STREAMS at a time, round by round (the fan-out's; else all in one),
    the largest first; why each one that is not failed."""
    token = hub_token()
    linkable = other_revisions(spec, local_dir)
    rounds = spec.get("rounds") or {}
    failures = []

    def one(entry):
        try:
            return fetch_resumable(spec, entry, local_dir, token, placed, linkable, sources)
        except HashMismatch as error:
            failure = str(error)
        except Exception as error:  # the unit fails once the others are done; its restart resumes this one
            failure = f"{entry['path']}: {type(error).__name__}: {error}"
        failures.append(failure)
        return failure

    with ThreadPoolExecutor(max_workers=STREAMS) as pool:
        for message in pool.map(one, sorted(spec["files"], key=lambda e: (rounds.get(e["path"], 0), -e["size"]))):
            if message:
                print(message, flush=True)
    return failures


def unsafe_names(spec: dict, local_dir: Path) -> list[str]:
    problems = []
    for entry in spec["files"]:
        problem = weights_manifest.entry_problem(entry)
        if not problem:
            try:
                weights_manifest.inside(local_dir, entry["path"])
            except ValueError as error:
                problem = str(error)
        if problem:
            problems.append(problem)
    return problems


def main(spec_path: str) -> int:
    spec = json.loads(Path(spec_path).read_text())
    local_dir = Path(spec["local_dir"])
    local_dir.mkdir(parents=True, exist_ok=True)
    refused = unsafe_names(spec, local_dir)
    problem = weights_sources.spec_problem(spec)
    if problem:
        refused.append(problem)
    if refused:
        print(f"refusing the listing, nothing written: {'; '.join(refused)}", file=sys.stderr)
        return 1
    placed = Placed(local_dir)  # read before the manifest goes
    placed.keep()
    weights_manifest.remove(local_dir)  # incomplete until proven otherwise
    for stale in (local_dir / STALE).glob("**/*.incomplete"):
        stale.unlink()
    for entry in spec["files"]:
        path = local_dir / entry["path"]
        if path.exists() and path.stat().st_size != entry["size"]:
            print(f"re-fetching {entry['path']}: {path.stat().st_size} bytes on disk, "
                  f"{entry['size']} on the hub", flush=True)
            path.unlink()
    sources = Sources(spec, local_dir)
    try:
        failures = fetch_all(spec, local_dir, placed, sources)
    finally:
        sources.keep()
    print(sources.line(), flush=True)
    if failures:
        print(f"not in place (the unit's restart fetches them again): {failures}", file=sys.stderr)
        return 1
    weights_manifest.write(local_dir, spec["repo_id"], spec["commit"], spec["files"], received=sources.summary())
    placed.done()
    sources.done()
    print(f"{spec['repo_id']}@{spec['commit']}: {len(spec['files'])} files complete", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
