"""P7: a fresh deploy of 3 lab hosts with the weights' fan-out against the same on 1 host, the hub's upload
the bottleneck.

The lab hub's whole upload is limited (upload_bps, shared by every response at once, as a site's uplink)
so that one copy of qwen36_ddtree's weights takes about a minute; without the fan-out three hosts would
take three copies' time. Fresh = new hosts each round (booting is not timed), the order alternating.
Reported with each run: the hub's bytes by repo and the wall time of every operation.
"""

import os
import time

import lab
from lab import hub
from lab.services import HUB_STATE
from speed import labctl
from speed.common import against_target, deploy, fmt, log, operation_times, ratio_summary, summary, write_result
from tests.helpers import serving

TARGET = 1.5
UPLOAD_BPS = 250_000  # qwen36_ddtree's 14 MB in about a minute per copy
SIZES = {"1": "pcie=1", "3": "pcie=3"}
ARGS = ("--data", "weights_fanout=true")


def fresh_deploy(spec: str) -> dict:
    labctl.remove_hosts()
    lab.up(spec, log=log)
    since = len(hub.read_request_log(HUB_STATE))
    hub.set_faults(HUB_STATE, upload_bps=UPLOAD_BPS)
    try:
        run = deploy(*ARGS, group_data=serving("qwen36_ddtree")).check()
    finally:
        hub.clear_faults(HUB_STATE)
    return {"seconds": run.seconds, "operations": operation_times(run),
            "hub_bytes": hub.bytes_served_by_repo(hub.read_request_log(HUB_STATE)[since:])}


def main(rounds: int = min(int(os.environ.get("BENCH_ROUNDS", "5")), 2)) -> dict:
    runs = {k: [] for k in SIZES}
    for r in range(rounds):
        for key in (["1", "3"] if r % 2 == 0 else ["3", "1"]):
            started = time.monotonic()
            runs[key].append(fresh_deploy(SIZES[key]))
            log(f"P7 round {r + 1}/{rounds}: {SIZES[key]} fresh deploy {runs[key][-1]['seconds']:.1f}s, the hub "
                f"served {runs[key][-1]['hub_bytes']} ({time.monotonic() - started:.0f}s with boot)")
    labctl.remove_hosts()
    seconds = {k: [run["seconds"] for run in v] for k, v in runs.items()}
    weights = {k: [run["operations"]["operations"].get("Weights", 0) for run in v] for k, v in runs.items()}
    result = {
        "measure": "fresh deploy.py of qwen36_ddtree on 3 new lab hosts (pcie=3, weights_fanout=true) / on 1 "
                   f"(pcie=1), the lab hub's upload limited to {UPLOAD_BPS} B/s",
        "target": f"<= {TARGET}", "rounds": rounds, "upload_bps": UPLOAD_BPS,
        "fresh_deploy_s": {k: summary(v) for k, v in seconds.items()},
        "weights_operation_s": {k: summary(v) for k, v in weights.items()},
        "ratio": ratio_summary(seconds["3"], seconds["1"]),
        "weights_ratio": ratio_summary(weights["3"], weights["1"]),
        "runs": runs,
    }
    result["met"] = result["ratio"]["median"] <= TARGET
    for key, spec in SIZES.items():
        print(f"P7 fresh deploy, {spec}  {fmt(result['fresh_deploy_s'][key])}; its Weights operation "
              f"{fmt(result['weights_operation_s'][key])}")
    print(against_target("P7 ratio 3/1  ", result["ratio"], TARGET))
    print(f"P7 Weights operation 3/1  {fmt(result['weights_ratio'], '')}")
    write_result("P7", result)
    return result


if __name__ == "__main__":
    main()
