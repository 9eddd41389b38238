"""The lab's package index: the wheels lab hosts install, served from the controller.

    python -m lab.index build --out DIR
        DIR/wheels/ gets uv, smg (the gateway), aiperf, huggingface_hub (the download bench) and their dependencies for the hosts
        (CPython 3.11, manylinux x86_64, as on Debian bookworm) and the two
        SGLang stand-in wheels built from lab/sglang_standin, each with the lab's torch stand-in
        (lab/torch_standin) beside it.
    python -m lab.index serve --dir DIR [--host H] [--port P]
        PEP 503 index at /simple/<name>/ and plain downloads at /wheels/<file>.

The DDTree stand-in is downloadable under /wheels/ but not listed in
/simple/sglang/: a pin `sglang==0.5.23` also matches local versions (PEP 440),
so pip would pick the higher `0.5.23+lab.ddtree29907` over `0.5.23+lab`.
"""

import argparse
import base64
import fcntl
import functools
import hashlib
import html
import io
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import zipfile
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import quote, unquote

from lab.config import CACHE_DIR, INDEX_PORT
from operations.python.virtualenvs import UV_VERSION

STANDIN_SRC = Path(__file__).resolve().parent / "sglang_standin" / "sglang"
# The lab's torch (a LAB STAND-IN answering from the host's GPU profile), shipped in the same wheel: the
# SGLang venv imports it where a real one imports the torch SGLang depends on (the GPU smoke test's workers).
TORCH_STANDIN_SRC = Path(__file__).resolve().parent / "torch_standin" / "torch"
# Stand-in builds: version -> (flag list it parses with, listed in /simple/?).
STANDIN_BUILDS = {
    "0.5.23+lab": ("flags_0_5_23.json", True),
    "0.5.23+lab.ddtree29907": ("flags_0_5_23_ddtree.json", False),
}
# huggingface_hub's CLI for the download benchmark (speed/p3.py, P3b), installed as a deploy installs a
# locked release: exactly the files of the committed hash lock, so --require-hashes passes.
HUB_LOCK = Path(__file__).resolve().parent.parent / "operations" / "python" / "locks" / "huggingface_hub==2.4.0.txt"
HUB_REQUIREMENTS = ["--require-hashes", "-r", str(HUB_LOCK)]
# uv, the hosts' installer (operations/python/virtualenvs.py): its locked wheel, fetched by install_uv.py from /simple/uv/.
UV_LOCK = HUB_LOCK.parent / f"uv=={UV_VERSION}.txt"
UV_REQUIREMENTS = ["--require-hashes", "-r", str(UV_LOCK)]
# The benchmark client's virtualenv (bench.py; it pins huggingface-hub<2) and the real SGLang model gateway
# (group_data/gateway.py): the files of their committed locks, which the hosts install with --require-hashes.
BENCH_REQUIREMENTS = ["--require-hashes", "-r", str(HUB_LOCK.parent / "aiperf==0.13.0.txt")]
GATEWAY_REQUIREMENTS = ["--require-hashes", "-r", str(HUB_LOCK.parent / "smg==1.13.0.txt")]
# The lab hosts, not the controller: CPython 3.11 on bookworm's glibc 2.36.
# pip takes platforms literally, so name every manylinux tag up to 2.36.
HOST_PLATFORMS = [f"manylinux_2_{minor}_x86_64" for minor in range(36, 4, -1)] + [
    "manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64"]
HOST_TARGET = ["--only-binary=:all:", "--python-version", "3.11", "--implementation", "cp",
               *(arg for p in HOST_PLATFORMS for arg in ("--platform", p))]
# Fixed zip timestamps, so the same source always gives the same wheel bytes.
ZIP_EPOCH = (1980, 1, 1, 0, 0, 0)


def build(out: Path) -> None:
    wheels = out / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    download_host_wheels(wheels)
    for version in STANDIN_BUILDS:
        print(build_standin_wheel(version, wheels))


def host_wheels_wanted() -> list:
    """What the hosts' wheels are downloaded from: the locks by their content, not by their path in a
    checkout, so that every lab and every clone on the machine shares one download."""
    return [*(Path(requirements[-1]).read_text() for requirements in (HUB_REQUIREMENTS, UV_REQUIREMENTS,
                                                                      BENCH_REQUIREMENTS, GATEWAY_REQUIREMENTS)),
            HOST_TARGET]


def download_host_wheels(wheels: Path) -> None:
    """pip download for the hosts' platform, once per machine and set of requirements, into CACHE_DIR
    (as the base roots are: make test's labs, started together, wait for one download), then linked
    into `wheels`."""
    want = host_wheels_wanted()
    cache = CACHE_DIR / f"host-wheels-{hashlib.sha256(json.dumps(want).encode()).hexdigest()[:16]}"
    stamp = cache / ".complete"  # the files the download gave
    CACHE_DIR.mkdir(parents=True, exist_ok=True)
    with open(CACHE_DIR / "host-wheels.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not stamp.is_file():
            shutil.rmtree(cache, ignore_errors=True)
            cache.mkdir()
            for requirements in (HUB_REQUIREMENTS, UV_REQUIREMENTS, BENCH_REQUIREMENTS, GATEWAY_REQUIREMENTS):
                subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--dest", str(cache),
                                *HOST_TARGET, *requirements], check=True)
            stamp.write_text(json.dumps(sorted(p.name for p in cache.glob("*.whl"))))
    for name in json.loads(stamp.read_text()):
        if not (wheels / name).is_file():
            partial = wheels / f".{name}.partial"
            try:
                os.link(cache / name, partial)
            except OSError:  # another filesystem
                shutil.copyfile(cache / name, partial)
            partial.replace(wheels / name)


def standin_requirement(version: str) -> str:
    """A pip requirement for the stand-in build VERSION pinned to its wheel's sha256 (the build is
    reproducible), so the hosts install it with --require-hashes as they would a real release."""
    return f"sglang=={version} --hash=sha256:{hashlib.sha256(standin_wheel_bytes(version)).hexdigest()}"


def build_standin_wheel(version: str, dest: Path) -> Path:
    path = dest / f"sglang-{version}-py3-none-any.whl"
    path.write_bytes(standin_wheel_bytes(version))
    return path


def standin_wheel_bytes(version: str) -> bytes:
    """A py3-none-any wheel of the stand-in, written with zipfile; its
    _build.json names the version and the flag list this build parses with."""
    flags, _listed = STANDIN_BUILDS[version]
    files = {
        f"{package}/{p.relative_to(source).as_posix()}": p.read_bytes()
        for package, source in (("sglang", STANDIN_SRC), ("torch", TORCH_STANDIN_SRC))
        for p in sorted(source.rglob("*"))
        if p.is_file() and "__pycache__" not in p.parts and p.name != "_build.json"
    }
    files["sglang/_build.json"] = json.dumps({"version": version, "flags": flags}).encode()
    info = f"sglang-{version}.dist-info"
    files[f"{info}/METADATA"] = (
        "Metadata-Version: 2.1\nName: sglang\n"
        f"Version: {version}\n"
        "Summary: LAB STAND-IN for SGLang (specfleet lab), not the real package\n"
        "Requires-Python: >=3.9\n"
    ).encode()
    files[f"{info}/WHEEL"] = (
        "Wheel-Version: 1.0\nGenerator: specfleet lab.index\n"
        "Root-Is-Purelib: true\nTag: py3-none-any\n"
    ).encode()
    files[f"{info}/top_level.txt"] = b"sglang\ntorch\n"
    record = "".join(f"{name},sha256={_b64_sha256(data)},{len(data)}\n" for name, data in files.items())
    files[f"{info}/RECORD"] = (record + f"{info}/RECORD,,\n").encode()

    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in files.items():
            entry = zipfile.ZipInfo(name, ZIP_EPOCH)
            entry.external_attr = 0o644 << 16
            entry.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(entry, data)
    return buf.getvalue()


def _b64_sha256(data: bytes) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


@functools.lru_cache(maxsize=None)
def _sha256(path: Path, size: int, mtime_ns: int) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as data:
        for block in iter(lambda: data.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def file_sha256(path: Path) -> str:
    """The wheel's sha256, hashed once per file version (a CUDA wheel is GBs; pages are asked for often)."""
    stat = path.stat()
    return _sha256(path, stat.st_size, stat.st_mtime_ns)


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()  # PEP 503


def listed_wheels(wheels: Path) -> dict[str, list[Path]]:
    """Project name -> its wheels that /simple/ lists (URL-only builds left out)."""
    unlisted = {f"sglang-{v}-py3-none-any.whl" for v, (_, listed) in STANDIN_BUILDS.items() if not listed}
    projects: dict[str, list[Path]] = {}
    for whl in sorted(wheels.glob("*.whl")):
        if whl.name not in unlisted:
            projects.setdefault(normalize(whl.name.split("-", 1)[0]), []).append(whl)
    return projects


class IndexHandler(BaseHTTPRequestHandler):
    root: Path  # the served DIR, set on a subclass by start_index()
    log_lock = threading.Lock()

    def do_GET(self):
        path = unquote(self.path.split("?", 1)[0].split("#", 1)[0])
        wheels = self.root / "wheels"
        if path == "/simple/":
            links = [f'<a href="{quote(n)}/">{html.escape(n)}</a>' for n in listed_wheels(wheels)]
            return self.send_page("Simple index", links)
        if m := re.fullmatch(r"/simple/([^/]+)/?", path):
            name = m.group(1)
            if normalize(name) != name or not path.endswith("/"):
                return self.redirect(f"/simple/{normalize(name)}/")
            files = listed_wheels(wheels).get(name)
            if not files:
                return self.send_status(404)
            links = [f'<a href="../../wheels/{quote(w.name)}#sha256={file_sha256(w)}">'
                     f"{html.escape(w.name)}</a>" for w in files]
            return self.send_page(f"Links for {name}", links)
        if m := re.fullmatch(r"/wheels/([^/]+\.whl)", path):
            whl = wheels / m.group(1)
            if whl.is_file():
                return self.send_file(whl)
        self.send_status(404)

    def do_HEAD(self):  # uv asks before it downloads (range support); the answer is GET's without the body
        self.do_GET()

    def send_file(self, path: Path) -> None:
        """Streamed: P6's index serves wheels of GBs (torch, CUDA libraries) to parallel downloads."""
        self.send_response(200)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(path.stat().st_size))
        self.end_headers()
        if self.command != "HEAD":
            with open(path, "rb") as data:
                shutil.copyfileobj(data, self.wfile, 1 << 20)

    def send_page(self, title: str, links: list[str]) -> None:
        body = f"<!DOCTYPE html>\n<html><head><title>{title}</title></head><body>\n"
        body += "<br>\n".join(links) + "\n</body></html>\n"
        self.send_data(200, body.encode(), "text/html")

    def redirect(self, location: str) -> None:
        self.send_response(301)
        self.send_header("Location", location)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def send_status(self, code: int) -> None:
        self.send_data(code, b"", "text/plain")

    def send_data(self, code: int, data: bytes, ctype: str) -> None:
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def log_request(self, code="-", size="-"):
        with self.log_lock, open(self.root / "requests.log", "a") as log:
            log.write(f"{self.command} {self.path} {int(code)}\n")

    def log_message(self, fmt, *args):  # requests.log is the log
        pass


class IndexServer:
    """A running index; .url is its /simple/ URL, .stop() shuts it down."""

    def __init__(self, root: Path, host: str, port: int):
        handler = type("Handler", (IndexHandler,), {"root": Path(root)})
        self.httpd = ThreadingHTTPServer((host, port), handler)
        self.httpd.daemon_threads = True
        self.host, self.port = host, self.httpd.server_address[1]
        self.url = f"http://{host}:{self.port}/simple/"
        self.wheels_url = f"http://{host}:{self.port}/wheels/"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join()


def start_index(dir: Path, host: str = "127.0.0.1", port: int = 0) -> IndexServer:
    """Serve DIR in a background thread; port 0 picks a free port."""
    return IndexServer(dir, host, port)


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -m lab.index")
    sub = parser.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="fill DIR/wheels")
    b.add_argument("--out", type=Path, required=True)
    s = sub.add_parser("serve", help="serve DIR/wheels as a PEP 503 index")
    s.add_argument("--dir", type=Path, required=True)
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=int, default=INDEX_PORT)
    args = parser.parse_args(argv)
    if args.cmd == "build":
        build(args.out)
        return
    server = start_index(args.dir, args.host, args.port)
    print(f"serving {args.dir / 'wheels'} at {server.url}", flush=True)
    try:
        server.thread.join()
    except KeyboardInterrupt:
        server.stop()


if __name__ == "__main__":
    main(sys.argv[1:])
