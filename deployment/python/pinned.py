"""What a requirement pins: the committed hash lock of a release, and the fingerprint that tells one build of
a virtualenv from another (operations/python/virtualenvs.py builds it; deployment/server/config.py names SGLang's
virtualenv after it)."""

import hashlib
import re

from deployment import site_directory

# The committed hash locks, one per release (NAME==VERSION.txt), beside their compiler (locks/compile.py).
LOCKS = site_directory.CHECKOUT / "operations" / "python" / "locks"
RELEASE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*==[A-Za-z0-9.!+_-]+")


def committed_lock(requirement: str) -> str | None:
    """The committed hash lock of a release pin (locks/NAME==VERSION.txt: it and every dependency,
    each with its wheels' sha256), else the site's (SITE/locks/NAME==VERSION.txt), or None."""
    if not RELEASE.fullmatch(requirement):
        return None
    site_locks = site_directory.locks_path()
    found = [path for path in (LOCKS / f"{requirement}.txt", *([site_locks / f"{requirement}.txt"] if site_locks else []))
             if path.is_file()]
    return found[0].read_text() if found else None


def fingerprint(requirement: str, index_url: str | None) -> str:
    """Identifies what was asked for: a change means a reinstall (and, for SGLang, a restart)."""
    lock = committed_lock(requirement)
    return hashlib.sha256(f"{requirement}|{index_url}{'|' + lock if lock else ''}".encode()).hexdigest()[:16]
