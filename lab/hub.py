"""A Hugging Face Hub stand-in that huggingface_hub 2.4 downloads from as from huggingface.co.

Serves the repos lab.repos writes, over plain HTTP, with the endpoints,
headers and error codes the real huggingface_hub 2.4 client was seen to need. LFS files
are redirected to a second port (the "CDN"), which, like S3, refuses requests
that carry Authorization. Standard library only: it runs on the controller
before any package index exists.

    python -m lab.hub serve --store DIR --state DIR [--host H] [--port P] [--cdn-port P]

STATE holds faults.json (read on every request, so faults change while the
hub runs), requests.jsonl (one line per request, never a token) and the CDN
signing key.
"""

import argparse
import hashlib
import hmac
import json
import os
import re
import signal
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, quote, unquote, urlsplit

from lab.config import CONTROLLER_IP, HUB_CDN_PORT, HUB_PORT, TOKEN_DENIED, TOKEN_GRANTED

CHUNK = 1024 * 1024
SHA_RE = re.compile(r"^[0-9a-f]{40}$")
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
INVALID_CREDENTIALS = "Invalid credentials in Authorization header"
USERS = {TOKEN_GRANTED: "lab-granted", TOKEN_DENIED: "lab-denied"}
AUTH_KINDS = {TOKEN_GRANTED: "granted", TOKEN_DENIED: "denied"}  # what the log says instead of a token
FAULTS_FILE = "faults.json"
LOG_FILE = "requests.jsonl"

# One lock per process for faults.json read-modify-write and log appends.
_state_lock = threading.Lock()


# ---------------------------------------------------------------- state helpers

def read_faults(state_dir) -> dict:
    try:
        return json.loads((Path(state_dir) / FAULTS_FILE).read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}


def _write_faults(state_dir, faults: dict) -> None:
    path = Path(state_dir) / FAULTS_FILE
    tmp = path.with_name(f".{FAULTS_FILE}.{os.getpid()}.{threading.get_ident()}")
    tmp.write_text(json.dumps(faults))
    os.replace(tmp, path)  # the hub never sees a half-written file


def set_faults(state_dir, **faults) -> None:
    """Merge faults into STATE/faults.json; each new response reads them.

    throttle_bps=int: cap on each file body's rate (per response; 0 = off).
    upload_bps=int: cap on the rate of every file body together (the hub's upload, shared by all
        responses at once, as a site's uplink; 0 = off).
    drop_after={substr: n}: cut the next matching body after n bytes, once.
    corrupt={substr: offset}: flip that byte of every matching body.
    gone=True: answer 503 to everything.
    hostile_listing={substr: name}: matching repos also list NAME (e.g. '../x'), an LFS file
        with the bytes of their first LFS file, and serve it under that name.
    hostile_commit={substr: commit}: matching repos answer COMMIT (e.g. one holding a newline)
        as their sha in model info, and resolve it as a revision.
    Substrings match against 'org/name/path/in/repo' (hostile_*: against 'org/name')."""
    with _state_lock:
        _write_faults(state_dir, {**read_faults(state_dir), **faults})


def clear_faults(state_dir) -> None:
    with _state_lock:
        _write_faults(state_dir, {})


def _take_drop(state_dir, key: str) -> int | None:
    """Byte count after which to cut this response; the entry is used up."""
    with _state_lock:
        faults = read_faults(state_dir)
        drops = faults.get("drop_after", {})
        match = next((s for s in drops if s in key), None)
        if match is None:
            return None
        cut = drops.pop(match)
        _write_faults(state_dir, faults)
        return cut


def read_request_log(state_dir) -> list[dict]:
    try:
        lines = (Path(state_dir) / LOG_FILE).read_text().splitlines()
    except FileNotFoundError:
        return []
    return [json.loads(line) for line in lines if line]


def bytes_served(state_dir, path_substring: str) -> int:
    return sum(r["bytes_sent"] for r in read_request_log(state_dir) if path_substring in r["path"])


def bytes_served_by_repo(records: list[dict]) -> dict[str, int]:
    """The file bodies' bytes the hub and its CDN sent, per repo id, in `records` (``read_request_log``'s)."""
    served: dict[str, int] = {}
    for r in records:
        if r.get("repo"):
            served[r["repo"]] = served.get(r["repo"], 0) + r["bytes_sent"]
    return served


class Upload:
    """The hub's upload as one link (upload_bps): each chunk of every response takes its turn on it."""

    _lock = threading.Lock()
    _free_at = 0.0  # when the link has sent every chunk given to it so far

    @classmethod
    def take(cls, size: int, bps: int) -> None:
        """Wait until `size` more bytes fit in the link's rate."""
        with cls._lock:
            cls._free_at = max(time.monotonic(), cls._free_at) + size / bps
            until = cls._free_at
        time.sleep(max(0.0, until - time.monotonic()))


def _log_request(state_dir, record: dict) -> None:
    line = json.dumps(record) + "\n"
    with _state_lock, open(Path(state_dir) / LOG_FILE, "a") as log:
        log.write(line)


# ---------------------------------------------------------------- repos

class Repo:
    """One repo as lab.repos laid it out: manifest plus files."""

    def __init__(self, root: Path):
        self.root = root
        manifest = json.loads((root / "manifest.json").read_text())
        self.id, self.sha, self.gated = manifest["id"], manifest["sha"], manifest["gated"]
        self.last_modified = manifest["last_modified"]
        self.files = {f["path"]: f for f in manifest["files"]}
        self.answered_sha = self.sha  # what model info says the commit is

    def with_faults(self, faults: dict) -> "Repo":
        """This repo as a hostile hub would answer for it (the hostile_* faults)."""
        name = next((n for s, n in faults.get("hostile_listing", {}).items() if s in self.id), None)
        if name:
            source = next(f for f in self.files.values() if f["lfs"])
            self.files[name] = {**source, "path": name, "stored": source["path"]}
        self.answered_sha = next((c for s, c in faults.get("hostile_commit", {}).items() if s in self.id),
                                 self.sha)
        return self

    def file_path(self, entry: dict) -> Path:
        return self.root / "files" / entry.get("stored", entry["path"])

    def resolves(self, revision: str) -> bool:
        return revision in ("main", self.sha, self.answered_sha)

    def dirs(self) -> set[str]:
        return {p.rsplit("/", i)[0] for p in self.files for i in range(1, p.count("/") + 1)}

    def entry_json(self, path: str) -> dict:
        """Tree / paths-info entry, for a file or a directory."""
        if path not in self.files:
            return {"type": "directory", "oid": hashlib.sha1(f"tree {self.sha} {path}".encode()).hexdigest(),
                    "size": 0, "path": path}
        f = self.files[path]
        entry = {"type": "file", "oid": f["git_oid"], "size": f["size"], "path": path}
        if f["lfs"]:
            entry["lfs"] = {"oid": f["sha256"], "size": f["size"], "pointerSize": f["pointer_size"]}
        return entry

    def sibling_json(self, f: dict, blobs: bool) -> dict:
        sibling = {"rfilename": f["path"]}
        if blobs:
            sibling.update(size=f["size"], blobId=f["git_oid"])
            if f["lfs"]:
                sibling["lfs"] = {"sha256": f["sha256"], "size": f["size"], "pointerSize": f["pointer_size"]}
        return sibling


def load_repo(store: Path, org: str, name: str) -> Repo | None:
    if not (NAME_RE.match(org) and NAME_RE.match(name)):
        return None
    root = store / "models" / org / name
    return Repo(root) if (root / "manifest.json").is_file() else None


# ---------------------------------------------------------------- HTTP

class HttpError(Exception):
    def __init__(self, status: int, message: str, code: str | None = None, headers: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.code, self.headers = status, message, code, headers or {}


def parse_range(header: str | None, size: int) -> tuple[int, int] | None:
    """(start, end-exclusive) for one 'bytes=' range, None for the whole file."""
    if not header:
        return None
    m = re.fullmatch(r"bytes=(\d*)-(\d*)", header.strip())
    if not m or m.groups() == ("", ""):
        raise HttpError(416, "Invalid range", headers={"Content-Range": f"bytes */{size}"})
    first, last = m.groups()
    if first == "":  # suffix range: the last N bytes
        start, end = max(size - int(last), 0), size
    else:
        start, end = int(first), min(int(last) + 1, size) if last else size
    if start >= size or start >= end:
        raise HttpError(416, "Range not satisfiable", headers={"Content-Range": f"bytes */{size}"})
    return start, end


class Handler(BaseHTTPRequestHandler):
    """Shared plumbing of the hub and CDN handlers: auth, errors, file bodies, logging."""

    protocol_version = "HTTP/1.1"  # keep-alive, as the client's connection pool expects
    timeout = 120  # seconds a socket may sit idle before its thread gives it up
    server_name: str  # 'hub' or 'cdn', for the request log
    hub: "Hub"

    def log_message(self, format, *args):  # requests.jsonl is the log
        pass

    def do_GET(self):
        self._serve()

    def do_HEAD(self):
        self._serve()

    def do_POST(self):
        self._serve()

    def _serve(self):
        self._status, self._bytes_sent, self._repo = 0, 0, None
        url = urlsplit(self.path)
        self.query = parse_qs(url.query)
        self.token = self._bearer_token()
        self.auth = "none" if self.token is None else AUTH_KINDS.get(self.token, "invalid")
        # Read any body up front: left unread it would corrupt the next request on this connection.
        self.body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.faults = read_faults(self.hub.state)
        try:
            if self.faults.get("gone"):
                raise HttpError(503, "Service Unavailable")
            self.route([unquote(s) for s in url.path.split("/")[1:]])
        except HttpError as e:
            self.send_error_json(e)
        except (ConnectionError, TimeoutError):  # the client went away mid-body
            self.close_connection = True
        finally:
            _log_request(self.hub.state, {
                "time": time.time(), "server": self.server_name, "method": self.command, "path": url.path,
                "status": self._status, "range": self.headers.get("Range"), "bytes_sent": self._bytes_sent,
                "auth": self.auth, "client": self.client_address[0], "repo": self._repo,
            })

    def route(self, parts: list[str]):
        raise NotImplementedError

    def _bearer_token(self) -> str | None:
        header = self.headers.get("Authorization")
        return header.removeprefix("Bearer ").strip() if header else None

    def send_status(self, status: int, headers: dict, length: int):
        self._status = status
        self.send_response(status)
        for key, value in headers.items():
            self.send_header(key, str(value))
        self.send_header("Content-Length", str(length))
        self.end_headers()

    def send_json(self, obj, status: int = 200, headers: dict | None = None):
        body = json.dumps(obj).encode()
        self.send_status(status, {"Content-Type": "application/json; charset=utf-8", **(headers or {})}, len(body))
        if self.command != "HEAD":
            self.wfile.write(body)
            self._bytes_sent += len(body)

    def send_error_json(self, e: HttpError):
        headers = {"X-Error-Message": e.message, **e.headers}
        if e.code:
            headers["X-Error-Code"] = e.code
        self.send_json({"error": e.message}, e.status, headers)

    def send_file(self, repo: Repo, entry: dict, etag: str):
        """Whole file or one Range of it, streamed in chunks, with the lab's faults applied."""
        size = entry["size"]
        byte_range = parse_range(self.headers.get("Range"), size)
        start, end = byte_range or (0, size)
        headers = {"ETag": f'"{etag}"', "X-Repo-Commit": repo.sha, "Accept-Ranges": "bytes",
                   "Content-Type": "application/octet-stream",
                   "Content-Disposition": f'attachment; filename="{entry["path"].rsplit("/", 1)[-1]}"'}
        if byte_range:
            headers["Content-Range"] = f"bytes {start}-{end - 1}/{size}"
        self.send_status(206 if byte_range else 200, headers, end - start)
        if self.command == "HEAD":
            return

        key = f"{repo.id}/{entry['path']}"
        self._repo = repo.id
        throttle = int(self.faults.get("throttle_bps") or 0)
        upload = int(self.faults.get("upload_bps") or 0)
        corrupt_at = next((off for s, off in self.faults.get("corrupt", {}).items() if s in key), None)
        cut = _take_drop(self.hub.state, key)
        # Small chunks when throttled, so the rate holds within a fraction of a second.
        limit = min(rate for rate in (throttle, upload) if rate) if throttle or upload else 0
        chunk_size = min(CHUNK, max(limit // 10, 1024)) if limit else CHUNK
        stop = end if cut is None else min(end, start + cut)
        began = time.monotonic()
        with open(repo.file_path(entry), "rb") as f:
            f.seek(start)
            pos = start
            while pos < stop:
                data = f.read(min(chunk_size, stop - pos))
                if not data:
                    raise OSError(f"{key} is shorter on disk than its manifest says")
                if corrupt_at is not None and pos <= corrupt_at < pos + len(data):
                    i = corrupt_at - pos
                    data = data[:i] + bytes([data[i] ^ 0xFF]) + data[i + 1:]
                if upload:
                    Upload.take(len(data), upload)
                self.wfile.write(data)
                pos += len(data)
                self._bytes_sent += len(data)
                if throttle:
                    time.sleep(max(0.0, began + self._bytes_sent / throttle - time.monotonic()))
        if cut is not None and stop < end:
            # Short body under a longer Content-Length: the client sees a broken transfer.
            self.wfile.flush()
            self.connection.shutdown(socket.SHUT_RDWR)
            self.close_connection = True


class HubHandler(Handler):
    server_name = "hub"

    def route(self, parts):
        if self.auth == "invalid":
            raise HttpError(401, INVALID_CREDENTIALS)
        if parts[:2] == ["api", "whoami-v2"]:
            return self.whoami()
        if parts[:2] == ["api", "models"] and len(parts) >= 4:
            repo = self.repo(parts[2], parts[3])
            rest = parts[4:]
            if not rest and self.command == "GET":
                return self.model_info(repo, "main")
            if len(rest) == 2 and rest[0] == "revision" and self.command == "GET":
                return self.model_info(repo, rest[1])
            if len(rest) >= 2 and rest[0] == "tree" and self.command == "GET":
                return self.tree(repo, rest[1], "/".join(rest[2:]).strip("/"))
            if len(rest) == 2 and rest[0] == "paths-info" and self.command == "POST":
                return self.paths_info(repo, rest[1])
        if len(parts) >= 5 and parts[2] == "resolve" and self.command in ("GET", "HEAD"):
            return self.resolve(self.repo(parts[0], parts[1]), parts[3], "/".join(parts[4:]))
        raise HttpError(404, "Sorry, we can't find the page you are looking for.")

    def repo(self, org: str, name: str) -> Repo:
        repo = load_repo(self.hub.store, org, name)
        if repo is None:
            # Like huggingface.co: anonymous callers can't tell "missing" from "private".
            raise HttpError(401 if self.auth == "none" else 404, "Repository not found", "RepoNotFound")
        return repo.with_faults(self.faults)

    def check_revision(self, repo: Repo, revision: str):
        if not repo.resolves(revision):
            raise HttpError(404, f"Invalid rev id: {revision}", "RevisionNotFound")

    def whoami(self):
        user = USERS.get(self.token)
        if user is None:
            raise HttpError(401, "Invalid username or password.")
        self.send_json({"type": "user", "id": hashlib.sha1(user.encode()).hexdigest()[:24], "name": user,
                        "fullname": user, "orgs": [],
                        "auth": {"type": "access_token", "accessToken": {"displayName": user, "role": "read"}}})

    def model_info(self, repo: Repo, revision: str):
        self.check_revision(repo, revision)
        blobs = self.query.get("blobs", ["false"])[0].lower() == "true"
        info = {"_id": repo.sha[:24], "id": repo.id, "modelId": repo.id, "author": repo.id.split("/")[0],
                "sha": repo.answered_sha, "lastModified": repo.last_modified, "private": False, "gated": repo.gated,
                "disabled": False, "downloads": 0, "likes": 0, "tags": [], "library_name": "transformers",
                "siblings": [repo.sibling_json(f, blobs) for f in repo.files.values()]}
        config = repo.files.get("config.json")
        if config:
            cfg = json.loads(repo.file_path(config).read_text())
            info["config"] = {k: cfg[k] for k in ("architectures", "model_type") if k in cfg}
        self.send_json(info)

    def tree(self, repo: Repo, revision: str, path: str):
        self.check_revision(repo, revision)
        recursive = self.query.get("recursive", ["false"])[0].lower() == "true"
        dirs = repo.dirs()
        if path and path not in dirs:
            raise HttpError(404, f"Entry not found: {path}", "EntryNotFound", {"X-Repo-Commit": repo.sha})
        prefix = f"{path}/" if path else ""
        below = [p for p in sorted(dirs | set(repo.files)) if p.startswith(prefix)]
        listed = below if recursive else [p for p in below if "/" not in p[len(prefix):]]
        cursor = int(self.query.get("cursor", ["0"])[0])
        page = listed[cursor:cursor + self.hub.tree_page_size]
        headers = {}
        if cursor + len(page) < len(listed):
            # The client follows the link as given: keep the original query, move the cursor.
            query = "&".join(f"{k}={quote(v[0])}" for k, v in self.query.items() if k != "cursor")
            link = f"http://{self.headers['Host']}{urlsplit(self.path).path}?{query}&cursor={cursor + len(page)}"
            headers["Link"] = f'<{link}>; rel="next"'
        self.send_json([repo.entry_json(p) for p in page], headers=headers)

    def paths_info(self, repo: Repo, revision: str):
        self.check_revision(repo, revision)
        form = parse_qs(self.body.decode())
        known = repo.dirs() | set(repo.files)
        self.send_json([repo.entry_json(p.strip("/")) for p in form.get("paths", []) if p.strip("/") in known])

    def resolve(self, repo: Repo, revision: str, path: str):
        self.check_revision(repo, revision)
        if repo.gated and self.auth != "granted":
            if self.auth == "none":
                raise HttpError(401, f"Access to model {repo.id} is restricted. You must have access to it "
                                     "and be authenticated to access it. Please log in.", "GatedRepo")
            raise HttpError(403, f"Access to model {repo.id} is restricted and you are not in the "
                                 "authorized list. Visit the repo page to ask for access.", "GatedRepo")
        entry = repo.files.get(path)
        if entry is None:
            raise HttpError(404, "Entry not found", "EntryNotFound", {"X-Repo-Commit": repo.sha})
        if not entry["lfs"]:
            return self.send_file(repo, entry, entry["git_oid"])
        host = self.headers.get("Host", f"{self.hub.host}:{self.hub.port}").rsplit(":", 1)[0]
        cdn_path = f"/{repo.id}/{repo.sha}/{quote(path)}"
        self.send_status(302, {
            "Location": f"http://{host}:{self.hub.cdn_port}{cdn_path}?sig={self.hub.sign(cdn_path)}",
            "X-Repo-Commit": repo.sha, "ETag": f'"{entry["git_oid"]}"',
            "X-Linked-Etag": f'"{entry["sha256"]}"', "X-Linked-Size": entry["size"],
        }, 0)


class CdnHandler(Handler):
    """Serves LFS bodies at URLs the hub signed, so gating can't be bypassed here."""
    server_name = "cdn"

    def route(self, parts):
        if "Authorization" in self.headers:
            raise HttpError(400, "Only one auth mechanism allowed; only the X-Amz-Algorithm query parameter, "
                                 "Signature query string parameter or the Authorization header should be specified")
        if self.command not in ("GET", "HEAD") or len(parts) < 4:
            raise HttpError(404, "NoSuchKey")
        signature = self.query.get("sig", [""])[0]
        if not hmac.compare_digest(signature, self.hub.sign(urlsplit(self.path).path)):
            raise HttpError(403, "SignatureDoesNotMatch")
        repo = load_repo(self.hub.store, parts[0], parts[1])
        repo = repo and repo.with_faults(self.faults)
        entry = repo and repo.sha == parts[2] and repo.files.get("/".join(parts[3:]))
        if not entry:
            raise HttpError(404, "NoSuchKey")
        self.send_file(repo, entry, entry["sha256"])


class Hub:
    """Both servers, each on its own thread. stop() shuts them down."""

    def __init__(self, store, state, host=CONTROLLER_IP, port=HUB_PORT, cdn_port=HUB_CDN_PORT,
                 tree_page_size=1000):
        self.store, self.state = Path(store), Path(state)
        self.state.mkdir(parents=True, exist_ok=True)
        self.tree_page_size = tree_page_size
        key_file = self.state / "cdn-signing-key"
        if not key_file.exists():  # kept across restarts so issued CDN links stay valid
            key_file.write_bytes(os.urandom(32))
        self._key = key_file.read_bytes()
        self.host = host
        self._servers = [self._server(HubHandler, host, port), self._server(CdnHandler, host, cdn_port)]
        self.port = self._servers[0].server_address[1]
        self.cdn_port = self._servers[1].server_address[1]
        self.url = f"http://{host}:{self.port}"
        self._threads = [threading.Thread(target=s.serve_forever, daemon=True) for s in self._servers]

    def _server(self, handler: type[Handler], host: str, port: int) -> ThreadingHTTPServer:
        bound = type(handler.__name__, (handler,), {"hub": self})
        server = ThreadingHTTPServer((host, port), bound, bind_and_activate=False)
        server.daemon_threads = True
        server.request_queue_size = 256  # 8 hosts x 8 workers connect at once
        server.allow_reuse_address = True
        server.server_bind()
        server.server_activate()
        return server

    def sign(self, path: str) -> str:
        return hmac.new(self._key, path.encode(), hashlib.sha256).hexdigest()

    def start(self) -> "Hub":
        for thread in self._threads:
            thread.start()
        return self

    def stop(self) -> None:
        for server in self._servers:
            server.shutdown()
            server.server_close()


def start_hub(store, state, host="127.0.0.1", port=0, cdn_port=0, tree_page_size=1000) -> Hub:
    """Start the hub in background threads; port 0 picks a free port (see .port, .cdn_port, .url)."""
    return Hub(store, state, host, port, cdn_port, tree_page_size).start()


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m lab.hub")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="run the hub in the foreground")
    serve.add_argument("--store", required=True, type=Path)
    serve.add_argument("--state", required=True, type=Path)
    serve.add_argument("--host", default=CONTROLLER_IP)
    serve.add_argument("--port", type=int, default=HUB_PORT)
    serve.add_argument("--cdn-port", type=int, default=HUB_CDN_PORT)
    serve.add_argument("--tree-page-size", type=int, default=1000)
    args = parser.parse_args(argv)
    hub = start_hub(args.store, args.state, args.host, args.port, args.cdn_port, args.tree_page_size)
    print(f"hub on {hub.url}, cdn on port {hub.cdn_port}, store {args.store}", flush=True)
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # stop on kill as on Ctrl-C
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        pass
    finally:
        hub.stop()


if __name__ == "__main__":
    main()
