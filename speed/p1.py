"""P1: a no-op re-run of the full deploy on 3 lab hosts, against the floor.

The floor is a pyinfra run on the same hosts that only connects and reads one fact
(speed/floor_deploy.py: `host.get_fact(server.Hostname)`); `pyinfra ... fact
server.Hostname` is timed too, for reference. Each round times the three runs back
to back (the order rotates), and the ratio is taken within a round. One extra
`--debug` no-op run counts the SSH commands each host gets, by operation and fact.
"""

import os

import lab
import statistics
import time

from speed.common import (PYINFRA, TOKEN, against_target, changed_operations, count_commands, deploy,
                          extract_commands, fmt, log, operation_times, phase_times, ratio_summary, run_timed, summary,
                          write_result)
from lab import fleet

SPEC = "pcie=2,b200=1"
TARGET = 2.0


def floor_run():
    return deploy(deploy_file="speed/floor_deploy.py").check()


def fact_run():
    return run_timed([PYINFRA, "lab/inventory.py", "fact", "server.Hostname"], env={"HF_TOKEN": TOKEN}).check()


def lean_run():
    """speed/lean_noop_deploy.py: the no-op's fact commands, each once, in one command per host."""
    return deploy(deploy_file="speed/lean_noop_deploy.py").check()


def noop_run():
    run = deploy().check()
    changed = changed_operations(run)
    if changed:
        raise RuntimeError(f"the re-run changed {changed}: not a no-op")
    return run


def cost_model(rounds: int = 3) -> dict:
    """Seconds one SSH round trip and one operation add to a run (3 hosts in parallel), from
    speed/roundtrip_deploy.py: 1 operation of 0 commands, 1 of 30 commands, 13 of 0 commands."""
    variants = {"base": (1, 0), "commands_30": (1, 30), "operations_13": (13, 0)}
    times = {k: [] for k in variants}
    for _ in range(rounds):
        for key, (ops, commands) in variants.items():
            run = deploy("--data", f"bench_ops={ops}", "--data", f"bench_commands={commands}",
                         deploy_file="speed/roundtrip_deploy.py").check()
            times[key].append(run.seconds)
    per_command = [(c - b) / 30 for c, b in zip(times["commands_30"], times["base"])]
    per_operation = [(o - b) / 12 for o, b in zip(times["operations_13"], times["base"])]
    return {"runs_s": {k: summary(v) for k, v in times.items()},
            "per_round_trip_s": summary(per_command), "per_operation_s": summary(per_operation)}


def on_host_times(debug_lines: list[str], host: fleet.LabHost, reps: int = 3) -> list[dict]:
    """Each command the no-op deploy ran on HOST, re-run there REPS times and timed on the host."""
    rows = []
    for op, fact, command in extract_commands(debug_lines, host.name):
        script = (f"s=$(date +%s%N); for i in $(seq {reps}); do {command} >/dev/null 2>&1; done; "
                  f"e=$(date +%s%N); echo $(((e - s) / {reps}))")
        seconds = int(fleet.ssh(host, script, check=False).strip().split()[-1]) / 1e9
        rows.append({"operation": op, "fact": fact, "on_host_s": round(seconds, 4), "command": command[:160]})
    return rows


def main(rounds: int = int(os.environ.get("BENCH_ROUNDS", "5"))) -> dict:
    log(f"P1: lab hosts {SPEC}")
    lab.up(SPEC, log=log)
    log("P1: converging deploy")
    deploy().check()
    noop_run()  # warm: the first re-run after a change may still settle something

    runs = {"noop": [], "floor": [], "fact": [], "lean": []}
    kinds = {"noop": noop_run, "floor": floor_run, "fact": fact_run, "lean": lean_run}
    order = list(kinds)
    noop_phases, noop_ops, floor_phases = [], [], []
    for r in range(rounds):
        for kind in order[r % 4:] + order[:r % 4]:
            run = kinds[kind]()
            runs[kind].append(run.seconds)
            if kind == "floor":
                floor_phases.append(phase_times(run))
            if kind == "noop":
                noop_phases.append(phase_times(run))
                noop_ops.append(operation_times(run))
        log(f"P1 round {r + 1}/{rounds}: noop {runs['noop'][-1]:.2f}s floor {runs['floor'][-1]:.2f}s "
            f"fact {runs['fact'][-1]:.2f}s lean what-if {runs['lean'][-1]:.2f}s")

    log("P1: --debug no-op run to count SSH commands")
    debug = deploy("--debug").check()
    commands = count_commands([line for _, line in debug.lines])
    floor_debug = deploy("--debug", deploy_file="speed/floor_deploy.py").check()
    floor_commands = count_commands([line for _, line in floor_debug.lines])
    log("P1: CPU the no-op costs the hosts; cost of one round trip and of one operation; each command timed")
    from speed.p4 import host_cpu
    lab_hosts = fleet.read_fleet()
    cpu_noop, cpu_idle = [], []
    for _ in range(3):
        before = host_cpu(lab_hosts)
        run = noop_run()
        after = host_cpu(lab_hosts)
        cpu_noop.append(sum(after.values()) - sum(before.values()))
        time.sleep(0)
        before = host_cpu(lab_hosts)
        time.sleep(run.seconds)
        after = host_cpu(lab_hosts)
        cpu_idle.append(sum(after.values()) - sum(before.values()))
    model = cost_model()
    debug_lines = [line for _, line in debug.lines]
    hosts = {h.name: h for h in fleet.read_fleet()}
    on_host = {name: on_host_times(debug_lines, hosts[name]) for name in ("lab-pcie-1", "lab-b200-1")}

    ratio = ratio_summary(runs["noop"], runs["floor"])
    median_phase = {k: round(sorted(p[k] for p in noop_phases)[len(noop_phases) // 2], 3)
                    for k in noop_phases[0]}
    median_ops = {k: round(sorted(o["operations"].get(k, 0) for o in noop_ops)[len(noop_ops) // 2], 3)
                  for k in noop_ops[0]["operations"]}
    result = {
        "measure": "no-op re-run of deploy.py on 3 lab hosts / floor (connect + one fact)",
        "hosts": SPEC, "target": f"<= {TARGET}", "rounds": rounds,
        "noop_s": summary(runs["noop"]), "floor_s": summary(runs["floor"]), "fact_cli_s": summary(runs["fact"]),
        "ratio": ratio, "ratio_vs_fact_cli": ratio_summary(runs["noop"], runs["fact"]),
        "what_if_one_command_per_host_s": summary(runs["lean"]),
        "what_if_ratio": ratio_summary(runs["lean"], runs["floor"]),
        "met": ratio["median"] <= TARGET,
        "noop_phases_median_s": median_phase,
        "floor_phases_median_s": {k: round(statistics.median(p[k] for p in floor_phases), 3)
                                  for k in floor_phases[0]},
        "noop_operation_wall_median_s": median_ops,
        "ssh_commands_noop": commands,
        "ssh_commands_floor": floor_commands["per_host_total"],
        "hosts_cpu_s_per_noop": summary(cpu_noop),
        "hosts_cpu_s_idle_same_duration": summary(cpu_idle),
        "cost_model": model,
        "on_host_command_s": on_host,
        "on_host_total_s": {name: round(sum(r["on_host_s"] for r in rows), 3) for name, rows in on_host.items()},
    }
    print(f"P1 no-op deploy   {fmt(result['noop_s'])}")
    print(f"P1 floor          {fmt(result['floor_s'])}")
    print(f"P1 fact CLI       {fmt(result['fact_cli_s'])}")
    print(against_target("P1 ratio         ", ratio, TARGET))
    print(f"P1 what-if: the same fact commands, each once, in 1 command per host (speed/lean_noop_deploy.py): "
          f"{fmt(result['what_if_one_command_per_host_s'])}, ratio {fmt(result['what_if_ratio'], '')}")
    print(f"P1 phases (median s): {median_phase}")
    print(f"P1 floor phases (median s): {result['floor_phases_median_s']}")
    print(f"P1 SSH commands per host (no-op): {commands['per_host_total']}; floor: "
          f"{floor_commands['per_host_total']}")
    b200 = on_host["lab-b200-1"]
    print("    operation                    commands (b200 host)  their time on the host")
    for op, per_host in commands["per_operation"].items():
        print(f"    {op:28} {max(per_host.values()):3}  {sum(r['on_host_s'] for r in b200 if r['operation'] == op):6.3f}s")
    print(f"P1 one SSH round trip adds {fmt(model['per_round_trip_s'])} to a run (3 hosts in parallel); "
          f"one empty operation {fmt(model['per_operation_s'])}")
    print(f"P1 the no-op's commands take {result['on_host_total_s']} s on the hosts themselves; the 3 hosts "
          f"use {fmt(result['hosts_cpu_s_per_noop'], ' CPU-s')} per no-op (idle for as long: "
          f"{fmt(result['hosts_cpu_s_idle_same_duration'], ' CPU-s')}) on {os.cpu_count()} shared cores")
    print("P1 slowest commands on lab-b200-1:")
    for row in sorted(b200, key=lambda r: -r["on_host_s"])[:6]:
        print(f"    {row['on_host_s']:.3f}s  {row['operation']} / {row['fact']}")
    write_result("P1", result)
    return result


if __name__ == "__main__":
    main()
