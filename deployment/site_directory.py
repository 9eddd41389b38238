"""Where the user's site directory is (`SPECFLEET_SITE`), outside this checkout: what every subject that reads
or writes a file of the site asks (deployment/site_data.py: its group data, pins and tuned files; the
hash locks of its own pins, deployment/python/pinned.py)."""

import os
from pathlib import Path

SITE_ENV = "SPECFLEET_SITE"
LOCKS_DIR = "locks"  # SITE/locks/NAME==VERSION.txt: the hash locks of the site's own pins
CHECKOUT = Path(__file__).resolve().parents[1]


def directory() -> Path | None:
    """The site directory SPECFLEET_SITE names, or None; stops with one line when it cannot be one."""
    value = os.environ.get(SITE_ENV, "").strip()
    if not value:
        return None
    site = Path(value).expanduser().resolve()
    if not site.is_dir():
        raise SystemExit(f"{SITE_ENV}={value} is not a directory: create it (mkdir -p {value}) or unset {SITE_ENV}")
    if site == CHECKOUT or CHECKOUT in site.parents:
        raise SystemExit(f"{SITE_ENV}={value} is inside the specfleet checkout ({CHECKOUT}): keep your site "
                         "directory outside it, where git pull never meets your files")
    return site


def locks_path() -> Path | None:
    """SITE/locks/: where the lock of a release the site pins (a gateway_requirement of its own) is written and
    read, beside the checkout's operations/python/locks/."""
    site = directory()
    return site / LOCKS_DIR if site else None
