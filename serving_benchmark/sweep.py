"""Serving benchmark of what was deployed: each mode (modes.py: ar, dflash, ddtree) served in turn, a
concurrency sweep with aiperf next to the server, results and a regression gate on the controller (bench.py).

The deployed unit is never edited: a mode runs as the transient unit `specfleet-bench` (loopback
only, so no API key is needed and none is handed to the client), confined as the deployed unit is
(its [Service] settings), while the deployed service is stopped, and the deployed service is
started again at the end, also after a failure or Ctrl+C. If the controller vanishes mid-run, the
transient unit stops by itself after its time limit and its ExecStopPost, as root, starts the
deployed service. The client imports the model's tokenizer code, so it runs as the server does: as
the service user, in a transient unit confined as the deployed unit (`specfleet-bench-client`, keyless
but through a gateway), in a directory that user owns: root only hands it out and takes back one
archive of it, which that user wrote to root's directory; what the server answers is data on the
controller, never part of a command.

It follows the deployment's layout: each replica's unit is stood in for by a bench unit on the same
GPUs and port (`specfleet-bench`, or with several replicas one each,
`specfleet-bench-<DEPLOYMENT>-gpu<GPUS>`). With several replicas each level runs against every replica
alone (unless each_replica=false), then against all of them at once, the client spreading its requests
round robin over them as the gateway's round_robin policy does: the host's figures (the summary's modes,
table, plots and gate).

Then, the deployed replicas serving again and back in their gateways, each level runs through every
gateway of their model whose only workers of it they are (`gateways.gateway_problem`): the deployed
configuration as its clients get it, with the API key (the summary's gateways).
"""

import dataclasses
import json
import signal
import subprocess
from datetime import datetime, timezone

import gevent
from pyinfra import host
from pyinfra.api import FunctionCommand, operation
from pyinfra.api.operation import OperationMeta

from deployment.gpu.config import SmokeTest
from deployment.server.config import Server
from operations.gpu import smoke as gpu_smoke
from operations.gpu.facts import NvidiaGpus
from operations.server import readiness
from operations.weights.checks import WeightsDisk
from serving_benchmark import behind_gateway, client, modes as bench_modes, remote, report, units
from serving_benchmark.gateways import through_gateways
from serving_benchmark.plan import REPO, Plan

ALL = "all"  # the results of every replica at once (raw/all/...)
STARTED = datetime.now(timezone.utc)  # one run id for every host of this pyinfra run


@operation(is_idempotent=False)
def sweep(replicas: tuple[Server, ...], plan: Plan, smoke: SmokeTest | None = None,
          routes: list | None = None, drained: list[OperationMeta | None] | None = None, results_subdir: str = "",
          settings: dict | None = None):
    """
    Serve each mode in turn on every replica, run the client at each concurrency (on each replica, then
    on all of them at once), bring the results back, restore; then run each level through every gateway
    that routes the model to these replicas alone.

    A mode the installed SGLang rejects (ddtree without a DDTree build) is skipped with the reason.
    Fails the host when a mode does not start, when a deployed replica does not come back, or when the
    results regress against ``plan.baseline``.

    + replicas: the deployment's replicas (their class is recorded in the summary)
    + plan: modes, concurrency levels, workload, results directory, baseline
    + smoke: the host's GPU smoke test, whose P2P decision the units' environment holds (``smoke.decided_env``)
    + routes, drained: per replica, the gateways it was drained from before the sweep (``drain.drain``):
      once its deployed unit generates again, it registers with them again
    + results_subdir: under the host's results, for a host serving several deployments (their names)
    + settings: per mode, a profile of the model's settings for it (``modes.of_model``), which a mode whose
      algorithm loads no drafter is served with

    **Example:**

    .. code:: python

        sweep.sweep(name="Benchmark sweep", replicas=d.replicas, plan=bench_plan(host.data), smoke=d.host.smoke,
                    routes=routes, drained=drained)
    """
    if smoke is not None:  # the environment the deployed units have, P2P decision included
        decided = gpu_smoke.decided_env(smoke)
        engine = dataclasses.replace(replicas[0].engine, env={**replicas[0].engine.env, **decided})
        replicas = tuple(dataclasses.replace(r, engine=engine) for r in replicas)
    server = replicas[0]
    settings = settings or {}
    modes = bench_modes.accepted(server, plan.modes, settings)
    gpus = host.get_fact(NvidiaGpus)
    ready_s = ready_after(server)
    rejoin = list(zip(routes or [[] for _ in replicas], drained or [None for _ in replicas]))
    yield FunctionCommand(run_sweep, (tuple(replicas), plan, modes, gpus, ready_s, rejoin, results_subdir, settings),
                          {})


def ready_after(server: Server) -> int:
    """How long a mode (and the deployed service after) may take to start: as the deploy allows it, from
    ready_timeout_s or the size of the weights on the host."""
    disk = host.get_fact(WeightsDisk, local_dirs=tuple(path for path in (server.engine.model_dir,
                                                                         server.engine.draft_model_dir) if path))
    weight_bytes = sum(sum((d or {}).get("files", {}).values()) for d in disk.values())
    return readiness.timeout_for(server.engine.service, weight_bytes)


def specfleet_commit() -> str:
    """The controller's specfleet commit, `-dirty` when the checkout has uncommitted changes."""
    def git(*args):
        return subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True).stdout.strip()
    commit = git("rev-parse", "HEAD") or "unknown"
    return commit + ("-dirty" if git("status", "--porcelain", "--untracked-files=no") else "")


_SWEEPS: set = set()  # the greenlets of the sweeps in progress (one per host)


class Interrupted(BaseException):
    """Ctrl+C during a sweep: the sweep stops and restores its host. A BaseException, like
    KeyboardInterrupt, so that no `except Exception` on the way (pyinfra's, paramiko's) swallows it."""


def _interrupt_sweeps(previous):
    """A SIGINT handler: interrupt the running sweeps (each then restores its host); with none
    running, pyinfra's own handler (exit)."""
    def handler(signum, frame):
        if not _SWEEPS:
            return previous(signum, frame) if callable(previous) else None
        for sweep_greenlet in list(_SWEEPS):
            gevent.kill(sweep_greenlet, Interrupted)  # raised in that greenlet at its next switch
        _SWEEPS.clear()
    return handler


def interruptible(body, *args) -> bool:
    """`body(*args)`, one host's sweep (or tune), with Ctrl+C raising Interrupted in it, which it answers by
    restoring its host (after `uninterruptible`, a second Ctrl+C exits pyinfra)."""
    if not _SWEEPS:
        signal.signal(signal.SIGINT, _interrupt_sweeps(signal.getsignal(signal.SIGINT)))
    _SWEEPS.add(gevent.getcurrent())
    try:
        return body(*args)
    except Interrupted:  # while writing the results: the host is restored already
        return False
    finally:
        _SWEEPS.discard(gevent.getcurrent())


def uninterruptible() -> None:
    """From here on a Ctrl+C exits pyinfra rather than interrupting this host's sweep (it is restoring)."""
    _SWEEPS.discard(gevent.getcurrent())


def run_sweep(state, host, replicas: tuple[Server, ...], plan: Plan, modes: dict, gpus, ready_s: int,
              rejoin: list, results_subdir: str, settings: dict) -> bool:
    """The sweep on one host (a FunctionCommand); the deployed replicas are started again whatever happens."""
    return interruptible(_sweep, host, replicas, plan, modes, gpus, ready_s, rejoin, results_subdir, settings)


def client_runs(replicas: tuple[Server, ...], plan: Plan) -> list[tuple[str, tuple[Server, ...]]]:
    """Where the client runs at each level, in order, named as the results are (raw/<name>/...): each
    replica alone (several replicas, unless ``plan.each_replica`` is false), then every replica at once,
    the host's levels ("all"; "" for a deployment of one replica)."""
    several = len(replicas) > 1
    alone = [(r.service_name, (r,)) for r in replicas] if several and plan.each_replica else []
    return [*alone, (ALL if several else "", tuple(replicas))]


def _sweep(host, replicas: tuple[Server, ...], plan: Plan, modes: dict, gpus, ready_s: int, rejoin: list,
           results_subdir: str, settings: dict) -> bool:
    d, several = replicas[0], len(replicas) > 1
    run_id = STARTED.strftime("%Y%m%dT%H%M%SZ")
    out = plan.results_dir / run_id / host.name / results_subdir
    remote_root = f"{remote.RUNS}/{run_id}"
    # Every level's bound, on each replica and then on all of them.
    runs = client_runs(replicas, plan)
    level_budget_s = sum(client.level_bound_s(plan, c) for c in plan.concurrency) * len(runs)
    out.mkdir(parents=True, exist_ok=True)
    failed, per_replica = [], {}
    remote.run_directory(host, d.engine.user, remote_root)
    try:
        for mode, result in modes.items():
            if "skipped" in result:
                host.log_styled(result["skipped"], fg="yellow")
                continue
            host.log(f"bench {mode}: starting {len(replicas)} server(s) ({' '.join(result['server_args'])})")
            started, said = units.start_mode(host, replicas, mode, ready_s + level_budget_s, settings)
            probes = [readiness.watch(host, r, ready_s, f"waiting for {mode} on {r.service_name} to generate", 2.0,
                                      service=units.bench_unit(r, several))[0] if started else {} for r in replicas]
            if not all(readiness.generates(p) for p in probes):
                _, journal = remote.run(host, f"journalctl -u {units.bench_unit(d, several)} -n 15 --no-pager -o cat")
                why = next((p.get("error") for p in probes if not readiness.generates(p)), said.strip())
                result["failed"] = f"{mode} did not start within {ready_s}s ({why or said.strip()})"
                host.log_styled(f"{result['failed']}; its journal:\n{journal}", fg="red")
                failed.append(mode)
                continue
            result["levels"] = {}
            for concurrency in plan.concurrency:
                for name, targets in runs:
                    where = f"{name}/" if name else ""
                    host.log(f"bench {mode}: concurrency {concurrency}, {plan.requests_at(concurrency)} requests"
                             + (f" on {name}" if name else ""))
                    measured, progress = client.measure(host, d, plan, f"{remote_root}/{where}{mode}/c{concurrency}",
                                                        out / "raw" / f"{where}{mode}" / f"c{concurrency}",
                                                        f"{where}{mode}/c{concurrency}/", concurrency, targets)
                    if measured is None:
                        result["failed"] = (f"the client failed at concurrency {concurrency} "
                                            f"(raw/{where}{mode}/c{concurrency}/client.log)")
                        host.log_styled(result["failed"], fg="red")
                        break
                    level = measured["level"]
                    if targets == tuple(replicas):
                        result["server_info"] = measured["server_info"]
                        result["levels"][str(concurrency)] = level
                    else:
                        per_replica.setdefault(name, {}).setdefault(mode, {"levels": {}})["levels"][
                            str(concurrency)] = level
                    host.log(f"bench {mode}: concurrency {concurrency}{' on ' + name if name else ''}: "
                             f"{level['output_tok_s']:.1f} output tok/s, {level['request_s']:.2f} req/s, "
                             f"accept length {level['accept_length']} ({progress})")
                if "failed" in result:
                    failed.append(mode)
                    break
    except Interrupted:
        host.log_styled("bench interrupted: stopping the client, starting the deployed service again", fg="yellow")
        failed.append("interrupted")
    finally:
        uninterruptible()  # a second Ctrl+C now exits pyinfra
        back = units.restore(host, replicas, remote_root, ready_s)
    failed += behind_gateway.back_in_gateways(host, back, rejoin)
    gateways = {}
    if rejoin[0][0] and not {"restore", "gateway", "interrupted"} & set(failed):
        _SWEEPS.add(gevent.getcurrent())  # Ctrl+C stops the client through the gateway, which cleans up
        try:
            gateways = through_gateways(host, replicas, plan, remote_root, out, rejoin[0][0])
        except Interrupted:
            host.log_styled("bench interrupted through the gateway: the deployed replicas serve", fg="yellow")
            failed.append("interrupted")
        finally:
            _SWEEPS.discard(gevent.getcurrent())
        failed += [f"through {name}" for name, result in gateways.items() if "failed" in result]

    meta = {"host": host.name, "host_class": d.engine.host_class, "profile": d.engine.profile_name, "started": run_id,
            "layout": {"deployment": d.engine.name, "tp_size": d.engine.tp_size,
                       "replicas": {r.service_name: list(r.gpus) for r in replicas}},
            "specfleet_commit": specfleet_commit(), "client": client.CLIENT_REQUIREMENT, "gpus": gpus,
            "workload": {"prompts": plan.prompts.name, "prompt_count": plan.prompt_count,
                         "output_tokens": plan.output_tokens,
                         "requests": {str(c): plan.requests_at(c) for c in plan.concurrency},
                         "endpoint": "/v1/chat/completions (streaming)"}}
    doc = report.summary(meta, modes)
    if several and plan.each_replica:
        doc["replicas"] = per_replica  # each replica alone; doc["modes"]: all of them at once
    if gateways:
        doc["gateways"] = gateways  # the deployed replicas through each of their gateways
    written = report.write_report(doc, out)
    host.log_styled(f"bench results: {', '.join(str(p) for p in written)}"
                    + (f" ({report.STAND_IN_LABEL})" if doc["stand_in"] else "")
                    + ("" if any(p.suffix == ".png" for p in written) else
                       "; no plots: they need matplotlib (pip install -e '.[dev]')"), fg="green")
    if plan.baseline is not None:
        try:
            worse = report.regressions(doc, json.loads(plan.baseline.read_text()),
                                             plan.max_throughput_drop, plan.max_accept_drop)
        except ValueError as error:
            host.log_styled(f"regression gate: {error}", fg="red")
            return False
        if worse:
            host.log_styled(f"regression gate: worse than {plan.baseline}:\n"
                            f"{report.regression_table(worse)}", fg="red")
            return False
        host.log_styled(f"regression gate: no level worse than {plan.baseline}", fg="green")
    return not failed
