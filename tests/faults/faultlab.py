"""Helpers the fault cases share: the hub's request log, the host's server, measurements."""

import base64
import json
import os
import subprocess
import time
from pathlib import Path

from lab import fleet, hub
from lab.config import LAB_ID, SGLANG_KNOBS_FILE
from lab.services import HUB_STATE
from deployment.hosts import resolve
from tests.unit.group_data import host_data

KIMI = "lab/Kimi-K2.6-tiny"
KIMI_DRAFTER = "lab/Kimi-K2.6-DFlash-tiny"
# The lab's Kimi revisions' directories (its pins are commits: resolve() names them without the hub).
TARGET_DIR = resolve(host_data("b200_nvlink", lab=True), "b200_nvlink").weights.target.local_dir
DRAFTER_DIR = resolve(host_data("b200_nvlink", lab=True), "b200_nvlink").weights.drafter.local_dir
TARGET_UNIT = resolve(host_data("b200_nvlink", lab=True), "b200_nvlink").weights.target.unit_name
SHARDS = [f"model-0000{i}-of-00004.safetensors" for i in range(1, 5)]
REPORT = Path(os.environ.get("SPECFLEET_FAULTS_REPORT", f"/tmp/specfleet-faults-lab{LAB_ID}.jsonl"))


def record(case: str, **numbers) -> None:
    """Print one measurement (pytest -s shows it) and append it to REPORT."""
    line = json.dumps({"case": case, **numbers})
    print(f"[faults] {line}")
    with REPORT.open("a") as report:
        report.write(line + "\n")


def served(path_substring: str) -> int:
    """Bytes the lab hub (and its CDN) have sent for paths containing `path_substring`."""
    return hub.bytes_served(HUB_STATE, path_substring)


def served_per_file(repo_id: str, names, host) -> dict[str, int]:
    """Bytes sent to `host` per file of `repo_id` (resolve and CDN requests together); what the controller's
    preflight reads (config.json, unless it kept it from an earlier run) is not the host's."""
    log = hub.read_request_log(HUB_STATE)
    return {name: sum(r["bytes_sent"] for r in log if r["client"] == host.address
                      and r["path"].startswith(f"/{repo_id}/") and r["path"].endswith(f"/{name}"))
            for name in names}


def repo_sizes(repo_id: str) -> dict[str, int]:
    manifest = json.loads((HUB_STATE.parent / "store" / "models" / repo_id / "manifest.json").read_text())
    return {f["path"]: f["size"] for f in manifest["files"]}


def http_status(host, path: str = "/health_generate") -> int:
    out = fleet.ssh(host, f"curl -s -o /dev/null -m 10 -w '%{{http_code}}' localhost:30000{path}", check=False)
    return int(out or 0)


def set_knobs(host, **knobs) -> None:
    """The SGLang stand-in's fault knobs (health_fail is re-read per request); none: clear them."""
    fleet.ssh(host, f"echo {json.dumps(json.dumps(knobs))} > {SGLANG_KNOBS_FILE}" if knobs
              else f"rm -f {SGLANG_KNOBS_FILE}")


def wait_for(predicate, timeout: float, interval: float = 0.2, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")


# Scans a host for a secret without ever putting it in a command line: the secret
# travels base64-encoded and is only compared in memory.
_SCAN = r"""
import base64, json, os, stat, subprocess, sys
secret = base64.b64decode(sys.argv[1])
hits = []
for pid in filter(str.isdigit, os.listdir("/proc")):
    for part in ("cmdline", "environ"):
        try:
            if secret in open(f"/proc/{pid}/{part}", "rb").read():
                hits.append(f"/proc/{pid}/{part}")
        except OSError:
            pass
for top in ("/etc", "/opt", "/srv", "/home", "/root", "/var", "/tmp", "/run", "/usr/local"):
    for root, dirs, names in os.walk(top):
        for name in names:
            path = os.path.join(root, name)
            try:
                st = os.lstat(path)  # regular files only: opening a FIFO would block
                if stat.S_ISREG(st.st_mode) and st.st_size < 64 << 20:
                    with open(path, "rb") as f:
                        if secret in f.read():
                            hits.append(path)
            except OSError:
                pass
journal = subprocess.run(["journalctl", "--no-pager", "-o", "cat"], capture_output=True).stdout
if secret in journal:
    hits.append("journal")
print(json.dumps(sorted(hits)))
"""


def secret_locations(host, secret: str) -> list[str]:
    """Every process argv/environment, file (not /proc, /sys) and journal line on `host` holding `secret`."""
    encoded = base64.b64encode(secret.encode()).decode()
    # It reads every file of a host holding virtualenvs: past 120 s in make test, beside two lab workers.
    return json.loads(fleet.ssh(host, f"python3 -c {_shell_quote(_SCAN)} {encoded}", timeout=360))


def _shell_quote(text: str) -> str:
    return "'" + text.replace("'", "'\"'\"'") + "'"


def start_deploy(*args: str, token: str = "hf_lab_granted") -> subprocess.Popen:
    """The deploy in the background (to fault it while it runs); its output goes to a temp file."""
    from tests.helpers import PYINFRA, REPO

    log = open(f"/tmp/specfleet-faults-deploy-{LAB_ID}-{time.monotonic_ns()}.log", "w+")
    process = subprocess.Popen([str(PYINFRA), "-y", "lab/inventory.py", "deploy.py", *args], cwd=REPO,
                               stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "HF_TOKEN": token})
    process.log = log
    return process


def output_of(process: subprocess.Popen) -> str:
    process.log.seek(0)
    return process.log.read()
