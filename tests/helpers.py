"""What the suites share: paths, the deploy as a user runs it, group data overrides, the lab CLI."""

import contextlib
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import lab
from lab import fleet, rootfs
from operations.basics.host_programs import HOST_SCRIPTS

REPO = Path(__file__).resolve().parent.parent
PYINFRA = Path(sys.executable).parent / "pyinfra"
LAB_INVENTORY = "lab/inventory.py"  # relative to REPO, as a user types it
LAB_HOSTS = os.environ.get("SPECFLEET_LAB_HOSTS", fleet.DEFAULT_SPEC)  # the shared lab's fleet
# Where each group's data lives: the lab's next to its inventory, the product's in group_data/.
GROUP_DATA_DIRS = (REPO / "group_data", REPO / "lab" / "group_data")


def lab_cli(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "lab", *args], cwd=REPO, capture_output=True,
                          text=True, check=check)


def run_deploy(*args: str, token: str = "hf_lab_granted", group_data: Path | None = None,
               timeout: float = 600) -> subprocess.CompletedProcess:
    """`pyinfra -y lab/inventory.py deploy.py ARGS` as a user runs it, with HF_TOKEN set to `token`.

    With --dry there is no -y: pyinfra then detects and lists what would change.
    """
    extra = ["--group-data", str(group_data)] if group_data else []
    confirm = [] if "--dry" in args else ["-y"]
    command = [str(PYINFRA), *confirm, *extra, LAB_INVENTORY, "deploy.py", *args]
    env = {**os.environ, "HF_TOKEN": token}
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, env=env, timeout=timeout)
    result.output = result.stdout + result.stderr
    return result


def group_data_file(group: str) -> Path:
    """The file holding `group`'s data (group_data/<group>.py, or the lab's lab/group_data/lab.py)."""
    return next(path for path in (d / f"{group}.py" for d in GROUP_DATA_DIRS) if path.exists())


def write_group_data(directory: Path, group: str, code: str) -> Path:
    """An extra group_data folder (pyinfra --group-data) whose `group`.py overrides keys with `code`.

    `base` holds the group's own values (copy what you change: `copy.deepcopy(base[...])`).
    """
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"{group}.py").write_text(
        f"import copy, runpy\nbase = runpy.run_path({str(group_data_file(group))!r})\n{code}\n"
        "del base\n")  # a helper, not a knob: the deploy refuses a key no knob has (deployment/schema.py)
    return directory


def serving(profile: str, directory: Path | None = None, code: str = "") -> Path:
    """Group data (pyinfra --group-data, in `directory` or a new one) whose all.py serves `profile` on every
    host, after `code`: the deploy takes what a host serves from group data, never from --data."""
    return write_group_data(directory or Path(tempfile.mkdtemp(prefix="specfleet-serving-")), "all",
                            f"{code}\nprofile = {profile!r}")


def results_table(output: str) -> dict[str, list[str]]:
    """pyinfra's closing table: operation -> [hosts, success, error, no change]."""
    table = output.split("--> Results:")[1].split("-->")[0]
    rows = {}
    for line in table.splitlines()[2:]:
        cells = re.split(r"\s{2,}", line.strip())
        if len(cells) == 5 and cells[0] != "Grand total":
            rows[cells[0]] = cells[1:]
    return rows


@contextlib.contextmanager
def behind_gateway(*data: str, key: str, admin_key: str, group_data: Path | None = None):
    """The shared lab with a gateway host (lab-gateway-1), the clients' key and the gateway's admin key
    set, deployed with `data` (and `group_data`): yields (hosts, the first deploy, its seconds). Afterwards the gateway host
    is stopped and the lab deployed back to its shared state (group_data's profile, loopback, no key)."""
    hosts = lab.up(f"{LAB_HOSTS},gateway=1", log=lambda line: None)
    keys = {"SPECFLEET_API_KEY": key, "SPECFLEET_GATEWAY_ADMIN_KEY": admin_key}
    os.environ.update(keys)
    try:
        started = time.monotonic()
        first = run_deploy(*data, group_data=group_data)
        yield hosts, first, time.monotonic() - started
    finally:
        lab.up(LAB_HOSTS, log=lambda line: None)
        for name in keys:
            del os.environ[name]
        restored = run_deploy("--data", "remove_api_key=true")
        assert restored.returncode == 0, restored.output[-3000:]


def changed_operations(output: str) -> list[str]:
    """The operations of a pyinfra run that changed or failed on a host, from its closing table: none
    for a run that changed nothing (every host of every operation counted as "No change")."""
    if "--> Results:" not in output:
        return ["(no results table)"]
    return [operation for operation, (hosts, success, error, no_change) in results_table(output).items()
            if (success, error) != ("-", "-") or no_change != hosts]


def operations_started(output: str) -> list[str]:
    return re.findall(r"--> Starting operation: (.+?) *$", output, flags=re.M)


# The lab's default deployment (group_data/all.py: Kimi K2.6) on either lab class: one replica over
# all eight GPUs, on port 30000 (group_data/<class>.py layouts).
SGLANG_UNIT = "sglang@kimi_k26_dflash-gpu0-7"
UNIT_FILE = f"/etc/systemd/system/{SGLANG_UNIT}.service"
ENV_FILE = f"/etc/specfleet/{SGLANG_UNIT}.env"


def server_info(host, port: int = 30000) -> dict:
    """/server_info of an SGLang server on a lab host (by default the one on port 30000), asked on the host itself."""
    return json.loads(fleet.ssh(host, f"curl -sf -m 10 localhost:{port}/server_info"))


def main_pid(host, unit: str = SGLANG_UNIT) -> str:
    """A unit's main pid on a lab host (a restart changes it)."""
    return fleet.ssh(host, f"systemctl show -p MainPID --value {unit}").strip()


def extra_bare_host(lab_hosts, short: str, restore_spec: str, suite: str = rootfs.DEFAULT_SUITE, bare: bool = True):
    """Boot one more `short` (pcie, b200...) lab host beside `lab_hosts`, bare (no driver; `bare=False`: as
    a host with its driver) and from Debian `suite`; yield it, then bring the lab back to `restore_spec`.
    For a module fixture."""
    counts = Counter(h.name.split("-")[1] for h in lab_hosts)
    counts[short] += 1
    name = f"lab-{short}-{counts[short]}"
    leftover = next((h for h in fleet.read_fleet() if h.name == name), None)
    if leftover:
        fleet.stop_host(leftover)  # bare, and from `suite`, only when booted so
    spec = ",".join(f"{kind}={count}" for kind, count in counts.items())
    yield next(h for h in lab.up(spec, log=lambda line: None, bare={name} if bare else set(), suite=suite)
               if h.name == name)
    lab.up(restore_spec, log=lambda line: None)


def host_programs_importable() -> None:
    """Make every subject's host programs importable by name, as they import each other on a host."""
    for directory in sorted({str(path.parent) for path in HOST_SCRIPTS.values()}):
        if directory not in sys.path:
            sys.path.insert(0, directory)
