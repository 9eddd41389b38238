"""Install the pinned uv binary from its PyPI wheel, hash-checked, into a root-owned path.

    python3 install_uv.py INDEX_URL VERSION DEST SHA256 [SHA256 ...]

Finds uv's wheel for this machine on the index's page for uv (PEP 503), downloads it, refuses it
unless its sha256 is one of the lock's (operations/python/locks/uv==VERSION.txt), then extracts the
static binary to DEST through a temporary file in DEST's directory, renamed into place.
Runs on any python3 (Ubuntu 22.04's 3.10 included): uv is what provides a newer Python there.
"""

import hashlib
import os
import platform
import re
import sys
import tempfile
import urllib.request
import zipfile
from io import BytesIO
from urllib.parse import urljoin, urlsplit


def main(index: str, version: str, dest: str, hashes: list[str]) -> int:
    machine = platform.machine()
    page_url = index.rstrip("/") + "/uv/"
    page = urllib.request.urlopen(page_url, timeout=60).read().decode()
    names = {}
    for href in re.findall(r'href="([^"]+)"', page):
        url = urljoin(page_url, href.replace("&amp;", "&"))
        name = urlsplit(url).path.rsplit("/", 1)[-1]
        if name.startswith(f"uv-{version}-py3-none-") and "manylinux" in name and f"_{machine}." in name:
            names[name] = url
    if not names:
        print(f"no uv {version} wheel for {machine} at {page_url}", file=sys.stderr)
        return 1
    name, url = sorted(names.items())[0]
    data = urllib.request.urlopen(url, timeout=300).read()
    digest = hashlib.sha256(data).hexdigest()
    if digest not in hashes:
        print(f"{name} from {url} hashes to sha256:{digest}, which the uv lock does not list: refused",
              file=sys.stderr)
        return 1
    binary = zipfile.ZipFile(BytesIO(data)).read(f"uv-{version}.data/scripts/uv")
    directory = os.path.dirname(dest)
    os.makedirs(directory, mode=0o755, exist_ok=True)
    fd, temporary = tempfile.mkstemp(dir=directory, prefix=".uv-")
    with os.fdopen(fd, "wb") as out:
        out.write(binary)
    os.chmod(temporary, 0o755)
    os.replace(temporary, dest)
    print(f"uv {version} ({name}, sha256 {digest[:12]}) -> {dest}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]))
