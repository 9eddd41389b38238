"""P5: a no-op re-run of the full deploy on 8 lab hosts against the same on 1, and what each host
costs the controller.

The lab boots 8 hosts (pcie=8) and converges them once; each round then runs the no-op on 1, 2, 4
and 8 of them (`--limit`; the order rotates), timing each run and the CPU-seconds (user + sys) the
pyinfra process used (getrusage of the reaped child: SSH runs inside it, through paramiko). Per
round: the ratio 8 hosts / 1 host, and a least-squares line CPU-s = fixed + per_host x hosts over
the four runs; per_host is `controller_cpu_s_per_host`, and the line is extrapolated to 256 hosts.
One `python -X importtime` run lists what the no-op imports on the controller, by top-level package.
"""

import os
import re
import resource
import statistics
import subprocess
from collections import defaultdict

import lab
from speed.common import (PYINFRA, REPO, TOKEN, against_target, changed_operations, deploy, fmt, log, ratio_summary,
                          summary, write_result)

SPEC = "pcie=8"
SIZES = (1, 2, 4, 8)
TARGET_RATIO, TARGET_CPU_PER_HOST = 1.3, 0.15
EXTRAPOLATE_TO = 256


def limited(hosts: list[str]) -> list[str]:
    return [arg for name in hosts for arg in ("--limit", name)]


def noop_run(hosts: list[str]) -> tuple[float, float]:
    """(wall seconds, controller CPU-seconds) of a no-op deploy limited to `hosts`."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    run = deploy(*limited(hosts)).check()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    changed = changed_operations(run)
    if changed:
        raise RuntimeError(f"the re-run changed {changed} on {hosts}: not a no-op")
    return run.seconds, after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime


def fit(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """(intercept, slope) of the least-squares line through (xs, ys)."""
    mean_x, mean_y = statistics.fmean(xs), statistics.fmean(ys)
    slope = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys)) / sum((x - mean_x) ** 2 for x in xs)
    return mean_y - slope * mean_x, slope


def import_times(hosts: list[str]) -> dict[str, float]:
    """Seconds the no-op spends importing each package on the controller (`-X importtime`: each
    module's own time, summed by its top-level package; a lazy `from huggingface_hub import HfApi`
    counts under huggingface_hub)."""
    process = subprocess.run([str(REPO / ".venv" / "bin" / "python"), "-X", "importtime", str(PYINFRA), "-y",
                              "lab/inventory.py", "deploy.py", *limited(hosts)], cwd=REPO, capture_output=True,
                             text=True, env={**os.environ, "HF_TOKEN": TOKEN})
    seconds: dict[str, float] = defaultdict(float)
    for line in process.stderr.splitlines():
        if match := re.match(r"import time:\s+(\d+) \|\s+\d+ \| *([\w.]+)$", line):
            seconds[match.group(2).split(".")[0]] += int(match.group(1)) / 1e6
    return dict(sorted(((k, round(v, 3)) for k, v in seconds.items()), key=lambda kv: -kv[1])[:15])


def main(rounds: int = int(os.environ.get("BENCH_ROUNDS", "5"))) -> dict:
    log(f"P5: lab hosts {SPEC}")
    hosts = [h.name for h in lab.up(SPEC, log=log)]
    log("P5: converging deploy")
    deploy().check()
    noop_run(hosts)  # warm: the first re-run after a change may still settle something

    wall: dict[int, list[float]] = {n: [] for n in SIZES}
    cpu: dict[int, list[float]] = {n: [] for n in SIZES}
    for r in range(rounds):
        order = SIZES[r % len(SIZES):] + SIZES[:r % len(SIZES)]
        for n in (order if r % 2 == 0 else order[::-1]):
            seconds, cpu_s = noop_run(hosts[:n])
            wall[n].append(seconds)
            cpu[n].append(cpu_s)
        log(f"P5 round {r + 1}/{rounds}: " + ", ".join(f"{n} hosts {wall[n][-1]:.2f}s {cpu[n][-1]:.2f} CPU-s"
                                                      for n in SIZES))

    lines = [fit(list(SIZES), [cpu[n][r] for n in SIZES]) for r in range(rounds)]
    wall_lines = [fit(list(SIZES), [wall[n][r] for n in SIZES]) for r in range(rounds)]
    ratio = ratio_summary(wall[8], wall[1])
    per_host = summary([slope for _, slope in lines])
    at_256 = summary([fixed + EXTRAPOLATE_TO * slope for fixed, slope in lines])
    result = {
        "measure": "no-op re-run of deploy.py on 8 lab hosts / 1 host; controller CPU-s per host per no-op "
                   "(slope of a line fitted over 1, 2, 4, 8 hosts)",
        "hosts": SPEC, "rounds": rounds,
        "target": f"ratio <= {TARGET_RATIO}; controller_cpu_s_per_host <= {TARGET_CPU_PER_HOST}",
        "noop_s": {str(n): summary(wall[n]) for n in SIZES},
        "controller_cpu_s": {str(n): summary(cpu[n]) for n in SIZES},
        "ratio": ratio,
        "controller_cpu_s_per_host": per_host,
        "controller_cpu_s_fixed": summary([fixed for fixed, _ in lines]),
        f"controller_cpu_s_at_{EXTRAPOLATE_TO}_hosts": at_256,
        "noop_wall_s_per_host": summary([slope for _, slope in wall_lines]),
        f"noop_wall_s_at_{EXTRAPOLATE_TO}_hosts_linear": summary([a + EXTRAPOLATE_TO * b for a, b in wall_lines]),
        "controller_import_s_by_package": import_times(hosts[:1]),
        "met": ratio["median"] <= TARGET_RATIO and per_host["median"] <= TARGET_CPU_PER_HOST,
    }
    for n in SIZES:
        print(f"P5 no-op on {n} host(s): {fmt(result['noop_s'][str(n)])}, controller {fmt(result['controller_cpu_s'][str(n)], ' CPU-s')}")
    print(against_target("P5 ratio 8 hosts / 1 host  ", ratio, TARGET_RATIO))
    print(f"{against_target('P5 controller CPU-s per host', per_host, TARGET_CPU_PER_HOST)}; fixed "
          f"{fmt(result['controller_cpu_s_fixed'], '')}")
    print(f"P5 extrapolated to {EXTRAPOLATE_TO} hosts: {fmt(at_256, ' CPU-s')} on the controller, which runs "
          f"pyinfra on one core: a {EXTRAPOLATE_TO}-host no-op takes at least that long "
          f"(the wall line gives {fmt(result[f'noop_wall_s_at_{EXTRAPOLATE_TO}_hosts_linear'])})")
    print(f"P5 controller imports (s, cumulative, one run): {result['controller_import_s_by_package']}")
    write_result("P5", result)
    return result


if __name__ == "__main__":
    main()
