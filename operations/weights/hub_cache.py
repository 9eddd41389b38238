"""What the hub answered for a pinned commit (its listing and config.json), kept on the controller for the next run.

A commit's files cannot change, so the run after the first reads them here instead of importing the hub client
(operations/weights/hub.py decides what is kept and validates what is read back as a fresh answer). The
directory, `$XDG_CACHE_HOME/specfleet/hub` (else `~/.cache/specfleet/hub`), is the user's own and 0700, each
entry 0600; nothing is kept in or read from a directory another user can write, and no link is followed.
Anything else is no cache: the hub is asked, as on a first run.
"""

import contextlib
import hashlib
import json
import os
import stat
import tempfile

MAX_ENTRY_BYTES = 16 << 20  # a listing of a few thousand files (~200 bytes each) and a config.json of a few kB
WRITABLE_BY_OTHERS = stat.S_IWGRP | stat.S_IWOTH


def _base() -> str:
    """$XDG_CACHE_HOME, else ~/.cache (the XDG spec ignores a relative $XDG_CACHE_HOME)."""
    configured = os.environ.get("XDG_CACHE_HOME", "")
    return configured if os.path.isabs(configured) else os.path.join(os.path.expanduser("~"), ".cache")


def _safe_above(path: str) -> bool:
    """Every directory from / down to PATH (links above the cache resolved: the real directories are the ones
    checked) is owned by the user or root and writable by neither group nor others: no other user can put a
    link or a file of theirs in the cache's way."""
    parts = [part for part in path.split(os.sep) if part]
    for depth in range(len(parts) + 1):
        try:
            info = os.lstat(os.sep + os.sep.join(parts[:depth]))
        except OSError:
            return False
        if (not stat.S_ISDIR(info.st_mode) or info.st_uid not in (os.geteuid(), 0)
                or info.st_mode & WRITABLE_BY_OTHERS):
            return False
    return True


def _own_directory(path: str) -> bool:
    """PATH made (0700) or found as the user's own directory, not a link, closed to group and others."""
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except OSError:
        return False
    try:
        info = os.lstat(path)
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid():
            return False
        if stat.S_IMODE(info.st_mode) != 0o700:
            os.chmod(path, 0o700)
    except OSError:
        return False
    return True


def directory() -> str | None:
    """The cache directory, made if missing; None where it cannot be the user's own (then nothing is kept)."""
    base = os.path.realpath(_base())
    if not os.path.lexists(base) and not (_safe_above(os.path.dirname(base)) and _own_directory(base)):
        return None
    specfleet = os.path.join(base, "specfleet")
    hub = os.path.join(specfleet, "hub")
    return hub if _safe_above(base) and _own_directory(specfleet) and _own_directory(hub) else None


def entry_name(endpoint: str, repo_id: str, commit: str) -> str:
    """One file per hub, repo and commit (a mirror answers for the same repo and commit on its own)."""
    return hashlib.sha256(f"{endpoint}\n{repo_id}\n{commit}".encode()).hexdigest() + ".json"


def read(endpoint: str, repo_id: str, commit: str) -> object | None:
    """The JSON kept for ENDPOINT, REPO_ID and COMMIT, as it parses (the caller validates it); None when there
    is none, or it is no regular file of the user's closed to others, or it does not parse."""
    where = directory()
    if where is None:
        return None
    try:
        fd = os.open(os.path.join(where, entry_name(endpoint, repo_id, commit)),
                     os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as kept:
        info = os.fstat(kept.fileno())
        if (not stat.S_ISREG(info.st_mode) or info.st_uid != os.geteuid() or info.st_mode & 0o077
                or info.st_size > MAX_ENTRY_BYTES):
            return None
        try:
            return json.loads(kept.read(MAX_ENTRY_BYTES + 1))
        except (OSError, ValueError, RecursionError):  # RecursionError: arrays nested past the parser's depth
            return None


def write(endpoint: str, repo_id: str, commit: str, answer: dict) -> None:
    """Keep ANSWER for ENDPOINT, REPO_ID and COMMIT (0600, replaced whole: a reader sees the old file or the
    new one); nothing is kept where the directory cannot be the user's own or the disk refuses."""
    where = directory()
    if where is None:
        return
    try:
        fd, partial = tempfile.mkstemp(dir=where, prefix=".", suffix=".partial")  # 0600, O_EXCL
    except OSError:
        return
    try:
        with os.fdopen(fd, "w") as out:
            json.dump(answer, out, separators=(",", ":"))
        os.replace(partial, os.path.join(where, entry_name(endpoint, repo_id, commit)))
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(partial)
