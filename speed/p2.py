"""P2: the deploy's no-op weights check of a 64-shard repo against a 2-shard repo of the same bytes.

Both repos (2 GiB each, lab/bench-2g-64 and lab/bench-2g-2) are built in this lab's
hub store and downloaded once, each as the deploy's target into its own weights_dir,
on one host. Then each round runs the deploy's weights stage (speed/weights_deploy.py:
the hub snapshot, fact WeightsState, noop) for both, in alternating order. Reported:
the Weights operation's wall time (primary), the whole weights-stage run, and the
WeightsState command itself timed on the host (20 runs in one SSH session) - plus,
for scale, what hashing the 64-shard repo (verify_weights's WeightsCorrupt) costs.
"""

import json
import os

import lab
from speed import repos
from speed.common import (against_target, changed_operations, deploy, fmt, log, operation_times, ratio_summary, summary,
                          write_result)
from lab import fleet
from lab.repos import KIMI_DFLASH
from operations.weights.download import WeightsCorrupt, WeightsState

SPEC = "pcie=2,b200=1"  # P1's fleet; P2 uses its first host only
TARGET = 1.3
LAYOUTS = {"64": ("lab/bench-2g-64", 64), "2": ("lab/bench-2g-2", 2)}


def host_time(host, command: str, reps: int) -> float:
    """Mean seconds of COMMAND on HOST over REPS runs, timed on the host (no SSH setup)."""
    script = (f"s=$(date +%s%N); for i in $(seq {reps}); do {command} >/dev/null; done; "
              "e=$(date +%s%N); echo $((e - s))")
    return int(fleet.ssh(host, script, timeout=600).strip()) / reps / 1e9


def main(rounds: int = int(os.environ.get("BENCH_ROUNDS", "5")) * 2) -> dict:
    hosts = lab.up(SPEC, log=log)
    host = hosts[0]
    log(f"P2: converging deploy on {host.name} (service user, tools venv, host scripts)")
    deploy("--limit", host.name).check()
    overrides, dirs = {}, {}
    for key, (repo_id, shards) in LAYOUTS.items():
        log(f"P2: bench repo {repo_id} ({shards} shards, {repos.GB2} bytes)")
        commit = repos.ensure(repo_id, repos.GB2, shards)
        weights_dir = f"/srv/specfleet/bench/p2-{key}"
        overrides[key] = repos.target_override(f"p2-{key}", repo_id, commit, weights_dir)
        dirs[key] = {f"{weights_dir}/moonshotai--Kimi-K2.6": repos.listing(repo_id),
                     f"{weights_dir}/z-lab--Kimi-K2.6-DFlash": repos.listing(KIMI_DFLASH)}
        log(f"P2: downloading it on {host.name} (once; kept for later runs)")
        deploy("--limit", host.name, group_data=overrides[key], deploy_file="speed/weights_deploy.py").check()

    op_s = {k: [] for k in LAYOUTS}
    run_s = {k: [] for k in LAYOUTS}
    for r in range(rounds):
        for key in (["64", "2"] if r % 2 == 0 else ["2", "64"]):
            run = deploy("--limit", host.name, group_data=overrides[key],
                         deploy_file="speed/weights_deploy.py").check()
            if changed_operations(run):
                raise RuntimeError(f"P2: the weights stage of the {key}-shard repo was not a no-op")
            op_s[key].append(operation_times(run)["operations"]["Weights"])
            run_s[key].append(run.seconds)
        log(f"P2 round {r + 1}/{rounds}: Weights op 64 {op_s['64'][-1]:.3f}s / 2 {op_s['2'][-1]:.3f}s")

    fact_s = {k: [] for k in LAYOUTS}
    for r in range(5):
        for key in LAYOUTS:
            sizes = {d: {f["path"]: f["size"] for f in listed} for d, listed in dirs[key].items()}
            fact_s[key].append(host_time(host, WeightsState().command(json.dumps(sizes, sort_keys=True)), 20))
    target_dir, listed = next(iter(dirs["64"].items()))
    hash_s = host_time(host, WeightsCorrupt().command(target_dir, json.dumps(listed), "sglang"), 1)

    result = {
        "measure": "no-op weights stage (hub snapshot + fact WeightsState + noop), 64 vs 2 shards, 2 GiB each",
        "host": host.name, "target": f"<= {TARGET}", "rounds": rounds, "total_bytes": repos.GB2,
        "weights_op_s": {k: summary(v) for k, v in op_s.items()},
        "ratio": ratio_summary(op_s["64"], op_s["2"]),
        "weights_stage_run_s": {k: summary(v) for k, v in run_s.items()},
        "ratio_whole_run": ratio_summary(run_s["64"], run_s["2"]),
        "weights_state_fact_on_host_s": {k: summary(v) for k, v in fact_s.items()},
        "ratio_fact_on_host": ratio_summary(fact_s["64"], fact_s["2"]),
        "hash_64_shards_on_host_s": round(hash_s, 3),
    }
    result["met"] = result["ratio"]["median"] <= TARGET
    for key in LAYOUTS:
        print(f"P2 Weights op, {key:>2} shards   {fmt(result['weights_op_s'][key])}")
    print(against_target("P2 ratio (Weights op)     ", result["ratio"], TARGET))
    print(f"P2 ratio (whole stage run) {fmt(result['ratio_whole_run'], '')}")
    print(f"P2 ratio (WeightsState on the host) {fmt(result['ratio_fact_on_host'], '')}; "
          f"64: {fmt(result['weights_state_fact_on_host_s']['64'])}")
    print(f"P2 for scale: hashing the 64-shard repo (verify_weights) takes {hash_s:.2f}s on the host")
    write_result("P2", result)
    return result


if __name__ == "__main__":
    main()
