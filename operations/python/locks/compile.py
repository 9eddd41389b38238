"""Write the committed hash lock of a release: it and every dependency, each wheel's sha256.

    python -m operations.python.locks.compile sglang==0.5.23

uv resolves the release for the GPU hosts (CPython 3.11, manylinux x86_64: Debian 12's python3 and
the Python uv provides elsewhere); PyPI's JSON simple API (PEP 691) then gives the sha256 of each
pinned version's wheels for CPython 3.11-3.13 on manylinux x86_64 (an sdist only where no wheel
fits). The lock stays small enough to travel in one command (operations/python/virtualenvs.py). With SPECFLEET_SITE set
it goes to the site's SITE/locks/ (a release the site pins itself, read there by the deploy), else
beside this file (the releases the shipped defaults install).
"""

import json
import re
import subprocess
import sys
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from deployment import site_directory

LOCKS = Path(__file__).resolve().parent
PYPI = "https://pypi.org/simple"
PYTHONS = ("cp311", "cp312", "cp313")
# uv's own name for the hosts' platform: glibc 2.36 (Debian 12) and newer.
PLATFORM = ["--python-version", "3.11", "--python-platform", "x86_64-manylinux_2_36"]


def resolve(requirement: str) -> list[tuple[str, str]]:
    """(name, version) of the release and every dependency, as uv resolves them for the hosts."""
    uv = Path(sys.executable).parent / "uv"
    out = subprocess.run([str(uv), "pip", "compile", "-", "--no-header", "--no-annotate", "--index-url", PYPI,
                          *PLATFORM], input=requirement, capture_output=True, text=True, check=True).stdout
    return re.findall(r"^([A-Za-z0-9._-]+)==(\S+)$", out, re.M)


def fits(filename: str) -> bool:
    """A wheel these hosts can install: pure Python up to 3.13 or one of PYTHONS (abi3 from 3.11 down), any
    platform or manylinux x86_64."""
    if not filename.endswith(".whl"):
        return False
    python, abi, platform = filename[:-4].split("-")[-3:]
    pythons = python.split(".")
    python_ok = (any(p in PYTHONS or p in ("py3", "py2") or re.fullmatch(r"py3(1[0-3]|[0-9])", p) for p in pythons)
                 or (abi == "abi3" and any(re.fullmatch(r"cp3(\d+)", p) and int(p[3:]) <= 11 for p in pythons)))
    platform_ok = platform == "any" or any("manylinux" in p and p.endswith("x86_64") for p in platform.split("."))
    return python_ok and platform_ok


def hashes(name: str, version: str) -> list[str]:
    request = urllib.request.Request(f"{PYPI}/{name}/", headers={"Accept": "application/vnd.pypi.simple.v1+json"})
    files = json.load(urllib.request.urlopen(request, timeout=60))["files"]
    mine = [f for f in files if f"-{version}-" in f["filename"] or f["filename"].endswith(f"-{version}.tar.gz")]
    wheels = [f["hashes"]["sha256"] for f in mine if fits(f["filename"])]
    return wheels or [f["hashes"]["sha256"] for f in mine if f["filename"].endswith(".tar.gz")]


def main(requirement: str) -> Path:
    pins = resolve(requirement)
    with ThreadPoolExecutor(8) as pool:
        found = list(pool.map(lambda pin: hashes(*pin), pins))
    lines = [f"{name}=={version} " + " ".join(f"--hash=sha256:{h}" for h in sorted(h_)) for (name, version), h_ in
             zip(pins, found)]
    where = site_directory.locks_path() or LOCKS
    where.mkdir(exist_ok=True)
    path = where / f"{requirement}.txt"
    path.write_text(f"# {requirement} and its dependencies, each wheel's sha256 as published on PyPI (CPython "
                    "3.11-3.13, manylinux x86_64),\n# resolved by uv for CPython 3.11 on manylinux_2_36 x86_64. "
                    "Written by `python -m operations.python.locks.compile "
                    f"{requirement}`.\n" + "\n".join(lines) + "\n")
    return path


if __name__ == "__main__":
    print(main(sys.argv[1]))
