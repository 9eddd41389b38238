"""P1: a no-op re-run of the full deploy on 3 lab hosts, against the floor.

The floor is a pyinfra run on the same hosts that only connects and reads one fact
(bench/floor_deploy.py: `host.get_fact(server.Hostname)`); `pyinfra ... fact
server.Hostname` is timed too, for reference. Each round times the three runs back
to back (the order rotates), and the ratio is taken within a round. One extra
`--debug` no-op run counts the SSH commands each host gets, by operation and fact.
"""

import os

from bench import labctl
from bench.common import (PYINFRA, REPO, TOKEN, changed_operations, count_commands, deploy, fmt, log,
                          operation_times, phase_times, ratio_summary, run_timed, summary, write_result)

SPEC = "pcie=2,b200=1"
TARGET = 2.0


def floor_run():
    return deploy(deploy_file="bench/floor_deploy.py").check()


def fact_run():
    return run_timed([PYINFRA, "inventory/lab.py", "fact", "server.Hostname"], env={"HF_TOKEN": TOKEN}).check()


def noop_run():
    run = deploy().check()
    changed = changed_operations(run)
    if changed:
        raise RuntimeError(f"the re-run changed {changed}: not a no-op")
    return run


def main(rounds: int = int(os.environ.get("BENCH_ROUNDS", "5"))) -> dict:
    log(f"P1: lab hosts {SPEC}")
    labctl.up(SPEC)
    log("P1: converging deploy")
    deploy().check()
    noop_run()  # warm: the first re-run after a change may still settle something

    runs = {"noop": [], "floor": [], "fact": []}
    kinds = {"noop": noop_run, "floor": floor_run, "fact": fact_run}
    order = list(kinds)
    noop_phases, noop_ops = [], []
    for r in range(rounds):
        for kind in order[r % 3:] + order[:r % 3]:
            run = kinds[kind]()
            runs[kind].append(run.seconds)
            if kind == "noop":
                noop_phases.append(phase_times(run))
                noop_ops.append(operation_times(run))
        log(f"P1 round {r + 1}/{rounds}: noop {runs['noop'][-1]:.2f}s floor {runs['floor'][-1]:.2f}s "
            f"fact {runs['fact'][-1]:.2f}s")

    log("P1: --debug no-op run to count SSH commands")
    debug = deploy("--debug").check()
    commands = count_commands([line for _, line in debug.lines])
    floor_debug = deploy("--debug", deploy_file="bench/floor_deploy.py").check()
    floor_commands = count_commands([line for _, line in floor_debug.lines])

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
        "met": ratio["median"] <= TARGET,
        "noop_phases_median_s": median_phase,
        "noop_operation_wall_median_s": median_ops,
        "ssh_commands_noop": commands,
        "ssh_commands_floor": floor_commands["per_host_total"],
    }
    print(f"P1 no-op deploy   {fmt(result['noop_s'])}")
    print(f"P1 floor          {fmt(result['floor_s'])}")
    print(f"P1 fact CLI       {fmt(result['fact_cli_s'])}")
    print(f"P1 ratio          {fmt(ratio, '')}  target <= {TARGET}: {'MET' if result['met'] else 'MISSED'}")
    print(f"P1 phases (median s): {median_phase}")
    print(f"P1 SSH commands per host (no-op): {commands['per_host_total']}; floor: "
          f"{floor_commands['per_host_total']}")
    for op, per_host in commands["per_operation"].items():
        print(f"    {op:28} {max(per_host.values())}")
    write_result("P1", result)
    return result


if __name__ == "__main__":
    main()
