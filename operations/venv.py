"""Isolated Python virtualenvs holding one pinned requirement each."""

import hashlib
import shlex

from pyinfra import host
from pyinfra.api import FactBase, operation

MARKER = ".specfleet-requirement"


def fingerprint(requirement: str, index_url: str | None) -> str:
    """Identifies what was asked for: a change means a reinstall (and, for SGLang, a restart)."""
    return hashlib.sha256(f"{requirement}|{index_url}".encode()).hexdigest()[:16]


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
    + requirement: a pip requirement: a PyPI pin, ``name @ git+URL@ref``, a wheel path or URL
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
    # Rebuilt whole: pip cannot reliably move a git build back to a release, and a
    # half-updated environment must never serve.
    yield f"rm -rf {venv} && python3 -m venv {venv}"
    yield (f"{venv}/bin/pip install --quiet --disable-pip-version-check --no-cache-dir {index}"
           f"{shlex.quote(requirement)}")
    yield f"echo {wanted} > {venv}/{MARKER}"
