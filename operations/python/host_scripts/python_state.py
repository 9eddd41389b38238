"""Runs ON THE HOST (imported by host_state.py): the answers to the Python facts
(operations/python/venv.py), each the lines that fact's own command prints."""

import os
import re
import subprocess
import sys

from host_facts import read_lines


def normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


def venv_requirement(args: dict) -> list[str] | None:
    """VenvRequirement: the distribution's version (METADATA in the site-packages of the Python the
    venv's bin/python is) and the marker's lines; nothing when bin/python is not executable."""
    path, distribution, marker = args["path"], args["distribution"], args["marker"]
    python = os.path.join(path, "bin", "python")
    if not os.access(python, os.X_OK):
        return []
    version = re.fullmatch(r"python(\d+\.\d+)", os.path.basename(os.path.realpath(python)))
    if not version:
        return None  # which site-packages that Python reads is not known without starting it
    site = os.path.join(path, "lib", f"python{version.group(1)}", "site-packages")
    found = ""
    try:
        entries = sorted(os.listdir(site))
    except OSError:
        entries = []
    for entry in entries:
        stem = entry[:-len(".dist-info")] if entry.endswith(".dist-info") else None
        if stem and normalized(stem.split("-")[0]) == normalized(distribution):
            for line in read_lines(os.path.join(site, entry, "METADATA")):
                if line.startswith("Version:"):
                    found = line.split(":", 1)[1].strip()
                    break
                if not line:
                    break
            break
    return [found, *(read_lines(os.path.join(path, marker)) or [""])]


def host_python(args: dict) -> list[str]:
    """HostPython: the machine, this python3 (the one the fact's command starts) and, where it is
    older than `minimum`, whether `source` answers at all; `uv --version`."""
    version = "%d.%d.%d" % sys.version_info[:3]
    reach = "-"
    if sys.version_info < tuple(args["minimum"]):
        # Imported only here: urllib.request costs a lab host's no-op 14 ms, which a current python3 never uses.
        import urllib.error
        import urllib.request
        try:
            urllib.request.urlopen(args["source"], timeout=5)
            reach = "reached"
        except urllib.error.HTTPError:  # an answer, whatever its status: the source is reachable
            reach = "reached"
        except Exception:
            reach = "unreachable"
    try:
        run = subprocess.run([args["uv"], "--version"], capture_output=True, text=True, timeout=30)
        uv_line = run.stdout.strip() if run.returncode == 0 and run.stdout.strip() else "uv none"
    except OSError:
        uv_line = "uv none"
    return [f"machine {os.uname().machine}", f"python {version} {reach}", uv_line]
