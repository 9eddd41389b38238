"""Isolated Python virtualenvs holding one pinned requirement each."""

import hashlib
import re
import shlex
from pathlib import Path

from pyinfra import host
from pyinfra.api import FactBase, operation

MARKER = ".specfleet-requirement"
LOCK = ".specfleet-requirements.lock"  # in the virtualenv: the hash lock pip installed it from
LOCKS = Path(__file__).resolve().parent / "locks"  # committed hash locks, one per release: NAME==VERSION.txt
RELEASE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*==[A-Za-z0-9.!+_-]+")


def committed_lock(requirement: str) -> str | None:
    """The committed hash lock of a release pin (locks/NAME==VERSION.txt: it and every dependency,
    each with its wheels' sha256), or None."""
    path = LOCKS / f"{requirement}.txt"
    return path.read_text() if RELEASE.fullmatch(requirement) and path.is_file() else None


def hash_lock(requirement: str) -> str | None:
    """What pip installs `requirement` from with --require-hashes: a requirement that carries its own
    --hash (a mirror's pinned build without dependencies), else the release's committed lock."""
    return f"{requirement}\n" if " --hash=" in requirement else committed_lock(requirement)


def fingerprint(requirement: str, index_url: str | None) -> str:
    """Identifies what was asked for: a change means a reinstall (and, for SGLang, a restart)."""
    lock = committed_lock(requirement)
    return hashlib.sha256(f"{requirement}|{index_url}{'|' + lock if lock else ''}".encode()).hexdigest()[:16]


class VenvRequirement(FactBase):
    """
    The version of `distribution` in the virtualenv and the fingerprint of the requirement it was built for.

    .. code:: python

        {"version": "0.5.23", "fingerprint": "3f2a9c0d1e4b5a6c"}
    """

    def command(self, path: str, distribution: str) -> str:
        venv = shlex.quote(path)
        show = f"import importlib.metadata as m; print(m.version({distribution!r}))"
        return (f"if [ -x {venv}/bin/python ]; then "
                f"{venv}/bin/python -c {shlex.quote(show)} 2>/dev/null || echo; "
                f"cat {venv}/{MARKER} 2>/dev/null || echo; fi")

    def process(self, output):
        version, marker = [*output, "", ""][:2]
        return {"version": version.strip() or None, "fingerprint": marker.strip() or None}


@operation()
def requirement(path: str, requirement: str, distribution: str, index_url: str | None = None):
    """
    Build a virtualenv holding `requirement`, rebuilding it only when the requirement changes.

    + path: where the virtualenv lives
    + requirement: a pip requirement: a PyPI pin, ``name @ git+URL@ref``, a wheel path or URL; a release
      pin with a committed lock (``operations/locks/``), or a requirement carrying ``--hash=``, is installed
      with ``--require-hashes``
    + distribution: the distribution it installs, to read its version
    + index_url: a PyPI mirror or private index (None: PyPI)

    **Example:**

    .. code:: python

        venv.requirement(
            name="Install SGLang",
            path="/opt/specfleet/sglang-venv",
            requirement="sglang==0.5.23",
            distribution="sglang",
        )
    """
    installed = host.get_fact(VenvRequirement, path=path, distribution=distribution)
    wanted = fingerprint(requirement, index_url)
    if installed and installed["version"] and installed["fingerprint"] == wanted:
        host.noop(f"{distribution} {installed['version']} is installed from {requirement}")
        return
    venv = shlex.quote(path)
    index = f"--index-url {shlex.quote(index_url)} " if index_url else ""
    lock = hash_lock(requirement)
    if lock is None and RELEASE.fullmatch(requirement):
        host.log_styled(f"{requirement}: no hash lock (operations/locks/{requirement}.txt), so pip checks no "
                        "hashes: generate one with `pip-compile --generate-hashes`", fg="yellow")
    # Rebuilt whole: pip cannot reliably move a git build back to a release, and a
    # half-updated environment must never serve.
    yield f"rm -rf {venv} && python3 -m venv {venv}"
    pip = f"{venv}/bin/pip install --quiet --disable-pip-version-check --no-cache-dir {index}"
    if lock:
        # Every file pip fetches must hash to a value in the lock; anything else is refused.
        yield f"printf %s {shlex.quote(lock)} > {venv}/{LOCK}"
        yield f"{pip}--require-hashes -r {venv}/{LOCK}"
    else:
        yield f"{pip}{shlex.quote(requirement)}"
    yield f"echo {wanted} > {venv}/{MARKER}"
