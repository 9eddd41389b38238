"""Runs ON THE HOST (imported by host_state.py): the answers to the Python facts
(operations/python/venv.py), each the lines that fact's own command prints; run alone
(`python_state.py PATH DISTRIBUTION MARKER`), VenvRequirement's own command."""

import glob
import os
import re
import subprocess
import sys

from host_facts import read_lines


def normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


def site_packages(path: str) -> str | None:
    """The site-packages of the virtualenv at `path`, from its files alone (starting its Python would run
    every .pth file there): the lib/pythonX.Y its bin/python's interpreter names, else the only one it has."""
    version = re.fullmatch(r"python(\d+\.\d+t?)", os.path.basename(os.path.realpath(os.path.join(path, "bin", "python"))))
    if version:
        return os.path.join(path, "lib", f"python{version.group(1)}", "site-packages")
    found = glob.glob(os.path.join(glob.escape(path), "lib", "python*", "site-packages"))
    return found[0] if len(found) == 1 else None


def venv_requirement(args: dict) -> list[str]:
    """VenvRequirement: the distribution's version (METADATA in the venv's site-packages, none where
    that is not known) and the marker's lines; nothing when bin/python is not executable."""
    path, distribution, marker = args["path"], args["distribution"], args["marker"]
    if not os.access(os.path.join(path, "bin", "python"), os.X_OK):
        return []
    site = site_packages(path)
    found = ""
    try:
        entries = sorted(os.listdir(site)) if site else []
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


def venvs_used(args: dict) -> list[str]:
    """VenvsUsed: "used PATH" or "unused PATH" for each virtualenv DIRECTORY/STEM* (a directory, not a link),
    used where a file matching `units` names its Python."""
    named = ""
    for pattern in args["units"]:
        for unit in glob.glob(pattern):
            named += "\n".join(read_lines(unit)) + "\n"
    return [f"{'used' if f'{path}/bin/python ' in named else 'unused'} {path}"
            for path in sorted(glob.glob(os.path.join(glob.escape(args["directory"]), glob.escape(args["stem"]) + "*")))
            if os.path.isdir(path) and not os.path.islink(path)]


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


if __name__ == "__main__":  # VenvRequirement's own command
    lines = venv_requirement({"path": sys.argv[1], "distribution": sys.argv[2], "marker": sys.argv[3]})
    if lines:
        print("\n".join(lines))
