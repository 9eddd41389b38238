"""Runs ON THE HOST, with the SGLang venv's python, as the user SGLang runs as: a short NCCL all-reduce
across all the GPUs, which also decides whether NCCL may use PCIe peer-to-peer on this host.

    gpu_smoke.py --floor-gbps 150 --timeout 180 --key KEY [--p2p-floor-gbps 30 --p2p-timeout 60]
                 [--previous /opt/specfleet/gpu-smoke.json]

The GPUs are the ones `nvidia-smi` lists; the record carries them, the driver and this boot's id
(a reboot is a new state: the deploy tests again after one).

The measuring engine is this script's own workers: one process per GPU, torch.distributed with
the NCCL backend, from the venv SGLang will run with (its torch, its NCCL, the unit's NCCL
environment). Each worker all-reduces float32 buffers of several sizes, checks the sum, and
times the iterations. Bus bandwidth is computed as nccl-tests does: algbw * 2(n-1)/n.

Catches before a long model load: a hanging P2P all-reduce (the workers are killed at --timeout),
a wrong sum, an engine that fails (CUDA error 802 while fabric manager is not ready), and a
bus bandwidth at the largest size below the class's floor (an NVLink board on a PCIe path).

Peer-to-peer, with --p2p-floor-gbps (a PCIe class): the all-reduce runs first as the unit's
environment has it (NCCL's own choice: P2P wherever the topology allows), bounded by
--p2p-timeout. A hang, an error or a bus bandwidth below the P2P floor turns P2P off for this
host: the all-reduce runs again with NCCL_P2P_DISABLE=1, and the record says so (`p2p`), with
what the P2P run gave. A hung P2P all-reduce is no error NCCL reports (NVIDIA/nccl#1999: the
first collective never completes), and it may leave the GPUs busy until a reset, so the
decision holds for later runs with the same key (--previous): P2P is tried again only when
the record is removed or the key changes. Without --p2p-floor-gbps (NVLink, where P2P is the
interconnect), or with P2P disabled by the environment, the all-reduce runs once as it is.

Prints the record as one JSON line (the deploy writes it to the host's record file), exits 0
when the verdict is "passed" (or "skipped": one GPU has nothing to reduce across), else 1.
"""

from __future__ import annotations

import argparse
import json
import os
import pwd
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from owned_sockets import LOOPBACK

SIZES = [1 << 20, 16 << 20, 128 << 20, 512 << 20]  # bytes of float32 per all-reduce
WARMUP, ITERATIONS = 5, 20


def bus_bandwidth_gbps(size: int, seconds: float, gpus: int) -> float:
    """nccl-tests' all-reduce bus bandwidth: what each link carries, comparable across GPU counts."""
    return size / seconds / 1e9 * 2 * (gpus - 1) / gpus


def worker(rank: int, gpus: int, port: int, sizes: list[int]) -> None:
    """One rank of the all-reduce; rank 0 prints the measurement JSON."""
    import torch
    import torch.distributed as dist

    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"tcp://{LOOPBACK}:{port}", rank=rank, world_size=gpus,
                            device_id=torch.device("cuda", rank))
    results = []
    for size in sizes:
        buffer = torch.empty(size // 4, dtype=torch.float32, device="cuda")
        buffer.fill_(rank + 1)
        dist.all_reduce(buffer)
        correct = bool(torch.all(buffer == gpus * (gpus + 1) / 2).item())
        for _ in range(WARMUP):
            dist.all_reduce(buffer)
        torch.cuda.synchronize()
        dist.barrier()
        started = time.perf_counter()
        for _ in range(ITERATIONS):
            dist.all_reduce(buffer)
        torch.cuda.synchronize()
        # The slowest rank's time is the collective's time.
        elapsed = torch.tensor([time.perf_counter() - started], dtype=torch.float64, device="cuda")
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
        ok = torch.tensor([1 if correct else 0], device="cuda")
        dist.all_reduce(ok, op=dist.ReduceOp.MIN)
        results.append(dict(bytes=size, seconds=elapsed.item() / ITERATIONS, correct=bool(ok.item())))
        del buffer
    if rank == 0:
        nccl = ".".join(str(part) for part in torch.cuda.nccl.version())
        print(json.dumps(dict(engine="torch.distributed+NCCL", torch=torch.__version__, nccl=nccl,
                              results=results)), flush=True)
    dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind((LOOPBACK, 0))
        return probe.getsockname()[1]


def host_gpus() -> tuple[int, str | None]:
    """(GPU count, driver version) as nvidia-smi lists them; (0, None) when it cannot."""
    try:
        listed = subprocess.run(["nvidia-smi", "--query-gpu=index,driver_version", "--format=csv,noheader"],
                                capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return 0, None
    rows = [line.split(", ") for line in listed.stdout.splitlines() if line.strip()] if listed.returncode == 0 else []
    return len(rows), rows[0][1] if rows else None


def engine_commands(gpus: int) -> list[list[str]]:
    sizes = ",".join(str(size) for size in SIZES)
    port = str(free_port())
    return [[sys.executable, __file__, "--worker", str(rank), "--gpus", str(gpus), "--port", port,
             "--sizes", sizes] for rank in range(gpus)]


def measurement_in(output: str) -> dict | None:
    """The last line of `output` that is a measurement (NCCL and torch may print around it)."""
    for line in reversed(output.strip().splitlines()):
        try:
            found = json.loads(line)
        except ValueError:
            continue
        if isinstance(found, dict) and "results" in found:
            return found
    return None


def run_engine(gpus: int, timeout: float, env: dict[str, str] | None = None) -> tuple[dict | None, str]:
    """(measurement, problem): the first process's JSON, or why there is none. `env`: settings on top of
    this process's environment (NCCL_P2P_DISABLE=1 for the run without P2P)."""
    # Files, not pipes: a rank blocked on a full pipe would look like a hang.
    commands = engine_commands(gpus)
    logs = [tempfile.TemporaryFile("w+") for _ in commands]
    processes = [subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, text=True, start_new_session=True,
                                  env={**os.environ, **(env or {})})
                 for command, log in zip(commands, logs)]
    deadline = time.monotonic() + timeout
    try:
        for process in processes:
            process.wait(timeout=max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        for process in processes:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)  # a hung NCCL rank ignores SIGTERM
        for process in processes:
            process.wait()
        return None, (f"the all-reduce did not finish within {timeout:g} s (hung: a P2P path that "
                      "never completes looks like this; try NCCL_P2P_DISABLE=1 and check `nvidia-smi topo -p2p r`)")
    outputs = []
    for log in logs:
        log.seek(0)
        outputs.append(log.read())
    failed = [(rank, process.returncode) for rank, process in enumerate(processes) if process.returncode]
    if failed:
        rank, code = failed[0]
        tail = " | ".join(outputs[rank].strip().splitlines()[-3:])
        return None, f"the all-reduce engine failed (process {rank} exited {code}): {tail}"
    measurement = measurement_in(outputs[0])
    if measurement is None:
        return None, f"the all-reduce engine printed no measurement: {outputs[0][-300:]!r}"
    return measurement, ""


def boot_id() -> str:
    return Path("/proc/sys/kernel/random/boot_id").read_text().strip()


def p2p_disabled(env) -> bool:
    """NCCL_P2P_DISABLE=1 in `env`: NCCL reads the value as a number (ncclGetEnv, then strtol) and disables
    P2P when it is 1."""
    number = re.match(r"\s*\+?(\d+)", env.get("NCCL_P2P_DISABLE") or "")
    return bool(number) and int(number.group(1)) == 1


def previous_decision(path: Path | None, key: str) -> dict | None:
    """The P2P decision measured before on this host for the same key (the record at `path`), if P2P was
    turned off: trying it again could hang the GPUs again."""
    try:
        previous = json.loads(path.read_text()) if path else None
    except (OSError, ValueError):
        return None
    decided = previous.get("p2p") if isinstance(previous, dict) and previous.get("key") == key else None
    if isinstance(decided, dict) and decided.get("enabled") is False and decided.get("decided_by") in (
            "measurement", "an earlier measurement"):
        return decided
    return None


def smoke_test(args) -> dict:
    """The record: what ran where, the figures per size, the P2P decision, and the verdict with its reason."""
    gpus, driver = host_gpus()
    record = dict(gpus=gpus, driver_version=driver, boot_id=boot_id(), floor_gbps=args.floor_gbps,
                  timeout_s=args.timeout, key=args.key, results=[],
                  measured_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    # Who measured: the service user, as the deploy runs it (the unit's environment reaches no root process).
    record["ran_as"] = pwd.getpwuid(os.geteuid()).pw_name
    if gpus == 0:
        return dict(record, verdict="failed", reason="nvidia-smi lists no GPUs: check the driver")
    if gpus == 1:
        return dict(record, verdict="skipped", reason="one GPU: nothing to all-reduce across")
    started = time.monotonic()

    def measured(env=None, timeout=args.timeout):
        measurement, problem = run_engine(gpus, timeout, env)
        return judge(dict(record, seconds=round(time.monotonic() - started, 1)), measurement, problem)

    if args.p2p_floor_gbps is None or p2p_disabled(os.environ):
        p2p = dict(enabled=not p2p_disabled(os.environ),
                   decided_by="the environment" if p2p_disabled(os.environ) else "the class")
        return dict(measured(), p2p=p2p)
    if earlier := previous_decision(args.previous, args.key):
        return dict(measured({"NCCL_P2P_DISABLE": "1"}), p2p=dict(earlier, decided_by="an earlier measurement"))
    trial = measured(timeout=args.p2p_timeout)
    trial_p2p = dict(verdict=trial["verdict"], busbw_gbps=trial.get("busbw_gbps"), seconds=trial["seconds"])
    if trial["verdict"] == "passed" and trial["busbw_gbps"] >= args.p2p_floor_gbps:
        return dict(trial, p2p=dict(enabled=True, decided_by="measurement", floor_gbps=args.p2p_floor_gbps,
                                    trial=trial_p2p))
    if trial["verdict"] == "passed":
        why = (f"P2P bus bandwidth {trial['busbw_gbps']:g} GB/s at {trial['results'][-1]['bytes'] >> 20} MiB is "
               f"below the P2P floor of {args.p2p_floor_gbps:g} GB/s")
    elif trial["results"]:  # it ran, and too slow for the class or with a wrong sum
        why = f"with P2P: {trial['reason']}"
    elif trial["reason"].startswith("the all-reduce did not finish"):
        why = f"the P2P all-reduce hung (no result within {args.p2p_timeout:g} s)"
    else:
        why = f"the P2P all-reduce failed: {trial['reason']}"
    without = measured({"NCCL_P2P_DISABLE": "1"})
    p2p = dict(enabled=False, decided_by="measurement", floor_gbps=args.p2p_floor_gbps, reason=why,
               trial=dict(trial_p2p, reason=trial["reason"]), decided_at=record["measured_at"],
               decided_boot_id=record["boot_id"])
    if without["verdict"] != "passed":
        if trial["reason"].startswith("the all-reduce did not finish"):
            # A hung P2P kernel can keep the GPUs busy after its processes are killed (local-inference-lab/rtx6kpro#15).
            without["reason"] += ("; a hung P2P all-reduce can keep the GPUs busy until a reset: reboot the host "
                                  "(P2P stays off for it)")
        else:  # failing either way: nothing says P2P is the cause, so nothing is decided
            p2p = dict(enabled=None, decided_by=None, reason=f"undecided: {why}, and without P2P too")
    return dict(without, p2p=p2p)


def judge(record: dict, measurement: dict | None, problem: str) -> dict:
    if measurement is None:
        return dict(record, verdict="failed", reason=problem)
    gpus = record["gpus"]
    results = [dict(result, busbw_gbps=round(bus_bandwidth_gbps(result["bytes"], result["seconds"], gpus), 2))
               for result in measurement["results"]]
    record.update({key: measurement.get(key) for key in ("engine", "torch", "nccl")}, results=results)
    peak = results[-1]["busbw_gbps"]  # the largest message: where the link's bandwidth shows
    record["busbw_gbps"] = peak
    wrong = [result["bytes"] for result in results if not result["correct"]]
    if wrong:
        return dict(record, verdict="failed", reason=f"wrong all-reduce sum at {', '.join(map(str, wrong))} bytes")
    if peak < record["floor_gbps"]:
        return dict(record, verdict="failed",
                    reason=f"bus bandwidth {peak:g} GB/s at {results[-1]['bytes'] >> 20} MiB is below the class's "
                    f"floor of {record['floor_gbps']:g} GB/s (a slower path than the class's interconnect)")
    return dict(record, verdict="passed", reason="")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="gpu_smoke.py")
    parser.add_argument("--gpus", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--floor-gbps", type=float)
    parser.add_argument("--timeout", type=float, default=180)
    parser.add_argument("--p2p-floor-gbps", type=float)
    parser.add_argument("--p2p-timeout", type=float, default=60)
    parser.add_argument("--previous", type=Path, help="the host's last record: a P2P decision it holds is kept")
    parser.add_argument("--key", default="")
    parser.add_argument("--worker", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--sizes", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker is not None:
        worker(args.worker, args.gpus, args.port, [int(size) for size in args.sizes.split(",")])
        return 0
    if args.floor_gbps is None:
        parser.error("--floor-gbps is required")
    record = smoke_test(args)
    print(json.dumps(record), flush=True)
    return 0 if record["verdict"] in ("passed", "skipped") else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
