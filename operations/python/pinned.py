"""What a requirement pins: the committed hash lock of a release, and the fingerprint that tells one build of
a virtualenv from another (operations/python/venv.py builds it; operations/server/config.py names SGLang's
virtualenv after it)."""

import hashlib
import re
from pathlib import Path

LOCKS = Path(__file__).resolve().parent / "locks"  # committed hash locks, one per release: NAME==VERSION.txt
RELEASE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*==[A-Za-z0-9.!+_-]+")


def committed_lock(requirement: str) -> str | None:
    """The committed hash lock of a release pin (locks/NAME==VERSION.txt: it and every dependency,
    each with its wheels' sha256), or None."""
    path = LOCKS / f"{requirement}.txt"
    return path.read_text() if RELEASE.fullmatch(requirement) and path.is_file() else None


def fingerprint(requirement: str, index_url: str | None) -> str:
    """Identifies what was asked for: a change means a reinstall (and, for SGLang, a restart)."""
    lock = committed_lock(requirement)
    return hashlib.sha256(f"{requirement}|{index_url}{'|' + lock if lock else ''}".encode()).hexdigest()[:16]
