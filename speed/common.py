"""What every benchmark shares: timed commands, deploys, statistics, result files."""

import json
import os
import platform
import re
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from datetime import datetime, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BENCH = REPO / "speed"
RESULTS = BENCH / "results"
PYINFRA = REPO / ".venv" / "bin" / "pyinfra"
if not PYINFRA.exists():
    PYINFRA = Path(sys.executable).parent / "pyinfra"
TOKEN = "hf_lab_granted"
WORK = REPO / "build" / "speed"  # scratch: group_data overrides, logs

sys.path.insert(0, str(REPO))


def log(message: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", flush=True)


class Timed:
    """A finished command: its wall time, exit status and output lines, each stamped on arrival."""

    def __init__(self, command, seconds, returncode, lines):
        self.command, self.seconds, self.returncode, self.lines = command, seconds, returncode, lines

    @property
    def output(self) -> str:
        return "\n".join(line for _, line in self.lines)

    def check(self) -> "Timed":
        if self.returncode != 0:
            raise RuntimeError(f"`{' '.join(map(str, self.command))}` failed ({self.returncode}):\n"
                               + self.output[-4000:])
        return self


def run_timed(command, env=None, cwd=REPO, timeout=900) -> Timed:
    """Run COMMAND, timing it from spawn to exit, with each output line's arrival time (stdout+stderr)."""
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    # As a user's Python does, the runs keep their compiled modules (__pycache__, which operations/__init__.py
    # keeps although pyinfra's CLI turns writing off): a controller with PYTHONDONTWRITEBYTECODE set (this
    # project's CI machine) compiles the deploy's ~100 modules again in every run.
    full_env.pop("PYTHONDONTWRITEBYTECODE", None)
    lines = []
    started = time.monotonic()
    process = subprocess.Popen([str(c) for c in command], cwd=cwd, env=full_env, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True, bufsize=1)
    for line in process.stdout:
        lines.append((time.monotonic() - started, line.rstrip("\n")))
        if time.monotonic() - started > timeout:
            process.kill()
            break
    returncode = process.wait()
    return Timed(command, time.monotonic() - started, returncode, lines)


def deploy(*args, group_data: Path | None = None, deploy_file: str = "deploy.py",
           inventory: str = "lab/inventory.py") -> Timed:
    """`pyinfra -y [--group-data DIR] lab/inventory.py DEPLOY ARGS`, as a user runs it (HF_TOKEN set)."""
    extra = ["--group-data", str(group_data)] if group_data else []
    return run_timed([PYINFRA, "-y", *extra, inventory, deploy_file, *args], env={"HF_TOKEN": TOKEN})


def summary(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values),
            "values": [round(v, 4) for v in values]}


def fmt(s: dict, unit: str = "s") -> str:
    return f"{s['median']:.3f}{unit} (min {s['min']:.3f}, max {s['max']:.3f}, n={s['n']})"


def against_target(label: str, figure: dict, target: float) -> str:
    """One report line: the figure's median (with its spread) against its target, MET or MISSED."""
    return f"{label} {fmt(figure, '')}  target <= {target}: {'MET' if figure['median'] <= target else 'MISSED'}"


def ratio_summary(numerators: list[float], denominators: list[float]) -> dict:
    """Ratios of paired runs (measured side by side in the same round)."""
    return summary([n / d for n, d in zip(numerators, denominators)])


def machine_load() -> dict:
    load1, load5, load15 = os.getloadavg()
    return {"loadavg": [round(load1, 2), round(load5, 2), round(load15, 2)], "cpus": os.cpu_count()}


def code_state() -> dict:
    """The commit measured, and the deploy's files that differed from it (others edit the tree too)."""
    def git(*args):
        return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True).stdout.strip()
    return {"commit": git("rev-parse", "HEAD"),
            "modified": git("status", "--porcelain", "--", "deploy.py", "deployment", "operations", "group_data",
                            "templates", "inventory").splitlines()}


def write_result(bench_id: str, result: dict) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    result = {"id": bench_id, "when": datetime.now(timezone.utc).isoformat(timespec="seconds"),
              "host": platform.node(), "code": code_state(), "lab_id": int(os.environ.get("SPECFLEET_LAB_ID", "0")),
              **result, "machine_after": machine_load()}
    path = RESULTS / f"{bench_id}.json"
    path.write_text(json.dumps(result, indent=1) + "\n")
    log(f"wrote {path.relative_to(REPO)}")
    return path


# ------------------------------------------------------------------ pyinfra --debug accounting

_OP = re.compile(r"^--> Starting operation: (.*?)\s*$")
_FACT = re.compile(r"\[pyinfra\.api\.facts\] Getting fact: (\S+)")
_RUN = re.compile(r"\[pyinfra\.connectors\.ssh\] Running command on (\S+?):")
_PUT = re.compile(r"\[pyinfra\.connectors\.ssh\] (?:Uploading|Attempting upload of) .* to (\S+?)\b|"
                  r"\[pyinfra\.connectors\.ssh\] File uploaded")


def count_commands(lines: list[str]) -> dict:
    """SSH commands per host per operation (and per fact) from `pyinfra --debug` output.

    Commands before the first operation (the deploy file's own facts at load time) count under
    "(deploy file)"."""
    per_op: dict = defaultdict(lambda: defaultdict(int))
    per_fact: dict = defaultdict(lambda: defaultdict(int))
    op, pending_fact = "(deploy file)", None
    for line in lines:
        if m := _OP.match(line):
            op = m.group(1)
        elif m := _FACT.search(line):
            pending_fact = m.group(1).rsplit(".", 1)[-1]
        elif m := _RUN.search(line):
            host = m.group(1)
            per_op[op][host] += 1
            per_fact[f"{op} / {pending_fact or 'operation command'}"][host] += 1
            pending_fact = None
    hosts = sorted({h for counts in per_op.values() for h in counts})
    return {
        "hosts": hosts,
        "per_host_total": {h: sum(c.get(h, 0) for c in per_op.values()) for h in hosts},
        "per_operation": {op: dict(c) for op, c in per_op.items()},
        "per_command": {k: dict(c) for k, c in per_fact.items()},
    }


def operation_times(timed: Timed) -> dict:
    """Wall time from each `--> Starting operation` line to the next (all hosts in parallel)."""
    marks = [(t, m.group(1)) for t, line in timed.lines if (m := _OP.match(line))]
    ends = [t for t, line in timed.lines if line.startswith("--> Results") or
            line.startswith("--> Disconnecting")]
    times, first = {}, None
    for i, (t, name) in enumerate(marks):
        nxt = marks[i + 1][0] if i + 1 < len(marks) else (ends[0] if ends else timed.seconds)
        times[name] = round(times.get(name, 0) + nxt - t, 3)
    if marks:
        first = marks[0][0]
    return {"before_first_operation": round(first or 0, 3), "operations": times,
            "after_last_operation": round(timed.seconds - (ends[0] if ends else timed.seconds), 3)}


_PHASES = [("start", None), ("inventory", "--> Loading inventory"), ("connect", "--> Connecting to hosts"),
           ("prepare", "--> Preparing operation files"), ("operations", "--> Beginning operation run"),
           ("results", "--> Results"), ("disconnect", "--> Disconnecting")]


def phase_times(timed: Timed) -> dict:
    """Seconds spent in each phase of a pyinfra run, by its `-->` banner lines.

    start: interpreter, pyinfra imports and config up to "Loading inventory"; prepare: running
    the deploy file for each host (controller-side hub calls, load-time facts); operations: the
    operation run; disconnect: from the results table to exit."""
    marks = [(0.0, "start")]
    for name, banner in _PHASES[1:]:
        t = next((t for t, line in timed.lines if banner and line.startswith(banner)), None)
        if t is not None:
            marks.append((t, name))
    marks.append((timed.seconds, "end"))
    return {name: round(marks[i + 1][0] - t, 3) for i, (t, name) in enumerate(marks[:-1])}


def first_line_time(timed: Timed) -> float:
    return timed.lines[0][0] if timed.lines else timed.seconds


def changed_operations(timed: Timed) -> list[str]:
    """Operations that reported Success (a change) on some host, from the results table."""
    changed, in_table = [], False
    for _, line in timed.lines:
        if line.startswith("--> Results"):
            in_table = True
            continue
        if in_table:
            cols = line.split()
            if len(cols) >= 5 and cols[0] != "Operation" and not line.strip().startswith("Grand total"):
                success = cols[-3]
                if success not in ("-", "0"):
                    changed.append(" ".join(cols[:-4]))
    return changed


def extract_commands(lines: list[str], host: str) -> list[tuple[str, str, str]]:
    """(operation, fact or "operation command", the shell command) run on HOST, from --debug output."""
    commands, op, fact, current = [], "(deploy file)", None, None
    prefix = f"[pyinfra.connectors.ssh] Running command on {host}: "
    for line in lines:
        stripped = line.strip()
        if current is not None:
            if stripped.startswith("[pyinfra") or line.startswith("-->") or re.match(r"^\s+\[[\w.-]+\] ", line):
                commands.append(current)
                current = None
            else:
                current = (current[0], current[1], current[2] + "\n" + line)
                continue
        if m := _OP.match(line):
            op = m.group(1)
        elif m := _FACT.search(line):
            fact = m.group(1).rsplit(".", 1)[-1]
        elif prefix in line:
            text = line.split(prefix, 1)[1]
            text = re.sub(r"^\(pty=\w+\) ", "", text)
            current = (op, fact or "operation command", text)
            fact = None
        elif _RUN.search(line):
            fact = None
    if current is not None:
        commands.append(current)
    return commands
