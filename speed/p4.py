"""P4: a full fresh deploy on 8 lab hosts against the same on 1 host.

Fresh = new hosts: each round removes the hosts (the hub and the index stay up) and
boots `pcie=1` or `pcie=8` from the base image, then times `pyinfra -y lab/inventory.py
deploy.py` (booting is not timed). The order alternates. Reported with each run: the
wall time of every operation (all hosts in parallel), the controller's pyinfra CPU
time, and how busy the machine's CPUs were during the run (all lab hosts share them).
"""

import os
import resource
import time
from collections import defaultdict

import lab
from speed import labctl
from speed.common import (against_target, deploy, fmt, log, operation_times, phase_times, ratio_summary, summary,
                          write_result)
from lab import fleet

TARGET = 1.5
CPU_TARGET_S = 8  # host CPU-seconds per host for a fresh deploy
SIZES = {"1": "pcie=1", "8": "pcie=8"}


def cpu_busy() -> tuple[float, float]:
    """(busy, total) jiffies of the whole machine, from /proc/stat."""
    fields = [int(x) for x in open("/proc/stat").readline().split()[1:]]
    idle = fields[3] + fields[4]
    return sum(fields) - idle, sum(fields)


def host_cpu(hosts) -> dict[str, float]:
    """CPU seconds (user + sys) each lab host's processes have used since boot, reaped ones included:
    every process under the host's systemd-nspawn, own time plus its reaped children's."""
    children = defaultdict(list)
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                fields = open(f"/proc/{entry}/stat").read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            children[int(fields[1])].append((int(entry), sum(int(x) for x in fields[11:15])))
    result = {}
    for host in hosts:
        pid, ticks, stack = fleet._pid(host), 0, []
        stack = [pid] if pid else []
        while stack:
            for child, used in children.get(stack.pop(), []):
                ticks += used
                stack.append(child)
        result[host.name] = ticks / os.sysconf("SC_CLK_TCK")
    return result


def fresh_deploy(spec: str) -> dict:
    labctl.remove_hosts()
    hosts = lab.up(spec, log=log)
    cpu0 = host_cpu(hosts)
    busy0, total0 = cpu_busy()
    ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    run = deploy().check()
    ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    busy1, total1 = cpu_busy()
    cpu1 = host_cpu(hosts)
    per_host = [round(cpu1[h] - cpu0[h], 2) for h in cpu0]
    return {"seconds": run.seconds, "operations": operation_times(run), "phases": phase_times(run),
            "pyinfra_cpu_s": round(ru1.ru_utime - ru0.ru_utime + ru1.ru_stime - ru0.ru_stime, 2),
            "host_cpu_s": per_host, "hosts_cpu_total_s": round(sum(per_host), 2),
            "machine_cpu_busy": round((busy1 - busy0) / max(total1 - total0, 1), 3)}


def main(rounds: int = min(int(os.environ.get("BENCH_ROUNDS", "5")), 2)) -> dict:
    runs = {k: [] for k in SIZES}
    for r in range(rounds):
        for key in (["1", "8"] if r % 2 == 0 else ["8", "1"]):
            started = time.monotonic()
            runs[key].append(fresh_deploy(SIZES[key]))
            log(f"P4 round {r + 1}/{rounds}: {SIZES[key]} fresh deploy {runs[key][-1]['seconds']:.1f}s "
                f"(machine CPU {runs[key][-1]['machine_cpu_busy']:.0%} busy; "
                f"{time.monotonic() - started:.0f}s with boot)")
    labctl.remove_hosts()

    seconds = {k: [run["seconds"] for run in v] for k, v in runs.items()}
    ops = {k: {op: summary([run["operations"]["operations"].get(op, 0) for run in v])["median"]
               for op in v[0]["operations"]["operations"]} for k, v in runs.items()}
    result = {
        "measure": "full fresh deploy.py on 8 new lab hosts (pcie=8) / on 1 (pcie=1)",
        "target": f"<= {TARGET}", "rounds": rounds,
        "fresh_deploy_s": {k: summary(v) for k, v in seconds.items()},
        "ratio": ratio_summary(seconds["8"], seconds["1"]),
        "operation_wall_median_s": ops,
        "operation_ratio_8_over_1": {op: round(ops["8"][op] / ops["1"][op], 2) if ops["1"].get(op) else None
                                     for op in ops["8"]},
        "pyinfra_cpu_s": {k: summary([run["pyinfra_cpu_s"] for run in v]) for k, v in runs.items()},
        "machine_cpu_busy": {k: summary([run["machine_cpu_busy"] for run in v]) for k, v in runs.items()},
        # Every host of every fresh deploy, both sizes: what one host costs (target <= 8 CPU-s).
        "cpu_per_host_s": summary([c for v in runs.values() for run in v for c in run["host_cpu_s"]]),
        "cpu_per_host_s_by_size": {k: summary([c for run in v for c in run["host_cpu_s"]]) for k, v in runs.items()},
        "hosts_cpu_total_s": {k: summary([run["hosts_cpu_total_s"] for run in v]) for k, v in runs.items()},
        "cores": os.cpu_count(),
        "runs": runs,
    }
    result["met"] = result["ratio"]["median"] <= TARGET
    for key, spec in SIZES.items():
        print(f"P4 fresh deploy, {spec}  {fmt(result['fresh_deploy_s'][key])}; machine CPU busy "
              f"{result['machine_cpu_busy'][key]['median']:.0%}, pyinfra CPU {result['pyinfra_cpu_s'][key]['median']}s")
    print(against_target("P4 ratio 8/1  ", result["ratio"], TARGET))
    for key, spec in SIZES.items():
        total = result["hosts_cpu_total_s"][key]["median"]
        print(f"P4 {spec}: the hosts used {total:.1f} CPU-s (per host {fmt(result['cpu_per_host_s_by_size'][key])}) + "
              f"pyinfra {result['pyinfra_cpu_s'][key]['median']:.1f} CPU-s; on {os.cpu_count()} cores that alone "
              f"needs >= {(total + result['pyinfra_cpu_s'][key]['median']) / os.cpu_count():.1f}s")
    print(against_target("P4 host CPU-s per host (all fresh deploys)", result["cpu_per_host_s"], CPU_TARGET_S))
    print("P4 operation wall time, 1 host -> 8 hosts (median s):")
    for op in ops["8"]:
        print(f"    {op:28} {ops['1'].get(op, 0):7.2f} -> {ops['8'][op]:7.2f}")
    write_result("P4", result)
    return result


if __name__ == "__main__":
    main()
