"""The tuner's trials on a host (tune.py): each candidate (tuning/candidates.py) served by the serving benchmark's
machinery (serving_benchmark/: transient bench units in the deployed replicas' place, confined as they are,
keyless on loopback, the client at each level asked), in the order the search (tuning/search.py) asks for them;
the deployed replicas are started again at the end, after a failure or Ctrl+C too, and each bench unit starts
them itself should the controller vanish (its ExecStopPost). Then the table, the plot and the pick, written to
SITE/tuned/<class>/<profile>.json.

The host's own SGLang judges each candidate's flags before its trial starts (sandbox.rejection); a refused
one counts as a trial that cannot lead. A trial runs the objective's level first and stops there once clearly
behind the leader (search.behind). Each level's GPU power draw is read with nvidia-smi where it can be.
"""

import dataclasses

from pyinfra import host
from pyinfra.api import FunctionCommand, operation
from pyinfra.api.operation import OperationMeta

from deployment import hosts as deployments, site_data, tuned
from deployment.gpu.config import SmokeTest
from deployment.hosts import Deployment
from deployment.server.command_line import server_args
from deployment.server.config import Server, sglang_build
from operations.gpu import smoke as gpu_smoke
from operations.gpu.facts import NvidiaGpus
from operations.server import readiness, sandbox
from operations.weights.checks import HubState
from serving_benchmark import behind_gateway, client, modes, remote, sweep, units
from tuning import candidates as candidates_of
from tuning import report, search
from tuning.plan import TunePlan

POWER_FILE = "/run/specfleet-tune-power"  # root's: nvidia-smi's samples during a level
POWER_INTERVAL_MS = 500


@operation(is_idempotent=False)
def tune(d: Deployment, data, plan: TunePlan, hub: HubState, smoke: SmokeTest | None = None,
         routes: list | None = None, drained: list[OperationMeta | None] | None = None):
    """
    Try the deployment's candidates on the host, as the search asks for them, and write the best to the site.

    Fails the host when no candidate meets the limits, when a deployed replica does not come back, or when
    the pick cannot be written.

    + d: the deployment, at the hub's commits (deployment.hosts.at_commits)
    + data: the host's data, which each candidate is resolved from as the deploy resolves a tuned file
    + plan: the workload, the levels, the objective, the search and the site (tuning/plan.py)
    + hub: the hub's answers (the KV plan and the weights' fit of each layout read its snapshots)
    + smoke: the host's GPU smoke test, whose P2P decision the units' environment holds
    + routes, drained: per replica, the gateways it was drained from (``drain.drain``)

    **Example:**

    .. code:: python

        trials.tune(name="Tune qwen36_ddtree", d=d, data=host.data, plan=tuning_plan(host.data), hub=hub)
    """
    gpus = host.get_fact(NvidiaGpus)
    found, left_out = candidates_of.candidates(data, d.host.host_class, d.name, d.host.gpu.expected, hub.snapshots,
                                              gpus, plan.algorithms)
    tuned_path = site_data.tuned_path(d.host.host_class, candidates_of.entry_profile(data, d.host.host_class, d.name))
    env = gpu_smoke.decided_env(smoke) if smoke is not None else {}
    points = [_serving(c, hub.commits, env) for c in found]
    deployed = tuple(_serving(candidates_of.Candidate({}, d), hub.commits, env).deployment.replicas)
    ready_s = sweep.ready_after(deployed[0])
    rejoin = list(zip(routes or [[] for _ in deployed], drained or [None for _ in deployed]))
    yield FunctionCommand(run_tune, (d, deployed, points, left_out, plan, ready_s, rejoin, tuned_path), {})


def _serving(candidate: candidates_of.Candidate, commits: dict, env: dict) -> candidates_of.Candidate:
    """The candidate as the host serves it: its weights at the hub's commits, the smoke test's P2P decision
    in its environment."""
    at = deployments.at_commits(candidate.deployment, commits)
    engine = dataclasses.replace(at.engine, env={**at.engine.env, **env})
    return dataclasses.replace(candidate, deployment=dataclasses.replace(at, engine=engine))


def run_tune(state, host, d: Deployment, deployed: tuple[Server, ...], points: list, left_out: list[str],
             plan: TunePlan, ready_s: int, rejoin: list, tuned_path) -> bool:
    """The trials on one host (a FunctionCommand); the deployed replicas are started again whatever happens."""
    return sweep.interruptible(_tune, host, d, deployed, points, left_out, plan, ready_s, rejoin, tuned_path)


def _power_start(servers: tuple[Server, ...]) -> str:
    gpus = ",".join(str(g) for s in servers for g in s.gpus)
    return (f"nohup nvidia-smi --query-gpu=power.draw --format=csv,noheader,nounits -i {gpus} "
            f"-lms {POWER_INTERVAL_MS} < /dev/null > {POWER_FILE} 2>/dev/null & echo $!")


def _power_stop(host, pid: str, gpus: int) -> float | None:
    if not pid.strip().isdigit():
        return None
    _, samples = remote.run(host, f"kill {pid.strip()} 2>/dev/null; cat {POWER_FILE} 2>/dev/null; rm -f {POWER_FILE}")
    return report.power(samples, gpus)


def _tune(host, d: Deployment, deployed: tuple[Server, ...], points: list, left_out: list[str], plan: TunePlan,
          ready_s: int, rejoin: list, tuned_path) -> bool:
    run_id = sweep.STARTED.strftime("%Y%m%dT%H%M%SZ")
    out = plan.bench.results_dir / f"tune-{run_id}" / host.name / d.name
    remote_root = f"{remote.RUNS}/tune-{run_id}"
    goal, bench = plan.objective, plan.bench
    order = [goal.concurrency, *(c for c in bench.concurrency if c != goal.concurrency)]
    level_budget_s = sum(client.level_bound_s(bench, c) for c in bench.concurrency)
    if left_out:  # each with its reason in trials.md: a line each here would bury the first trial
        host.log_styled(f"tune: {len(left_out)} candidate{'' if len(left_out) == 1 else 's'} left out before any "
                        "trial (the layout, the KV plan or the weights rule them out; each with its reason in "
                        "trials.md)", fg="yellow")
    serving: tuple[str, ...] = ()  # the bench units of the last trial
    stand_in = []

    def measure(point, bar):
        nonlocal serving
        number = len(result_trials) + 1
        servers = tuple(modes.on_loopback(r) for r in point.deployment.replicas)
        args = [server_args(s) for s in servers]
        refused = sandbox.rejection(host, servers[0], args[0])
        if refused:
            host.log_styled(f"tune {number}: {point.label} refused by the host's SGLang: {refused}", fg="yellow")
            return search.Trial({}, stopped=True)
        host.log(f"tune {number}: {point.label}: starting {len(servers)} server(s) ({' '.join(args[0])})")
        started, said = units.start(host, deployed, servers, args, ready_s + level_budget_s, previous=serving)
        several = len(servers) > 1
        serving = tuple(units.bench_unit(s, several) for s in servers)
        probes = [readiness.watch(host, s, ready_s, f"waiting for trial {number} on {s.service_name} to generate",
                                  2.0, service=units.bench_unit(s, several))[0] if started else {} for s in servers]
        if not all(readiness.generates(p) for p in probes):
            host.log_styled(f"tune {number}: {point.label} did not start within {ready_s}s ({said.strip()})", fg="red")
            return search.Trial({}, stopped=True)
        levels = {}
        for c in order:
            _, pid = remote.run(host, _power_start(servers))
            measured, progress = client.measure(host, servers[0], bench, f"{remote_root}/t{number}/c{c}",
                                                out / "raw" / f"t{number}" / f"c{c}", f"t{number}/c{c}/", c, servers)
            watts = _power_stop(host, pid, sum(len(s.gpus) for s in servers))
            if measured is None:
                host.log_styled(f"tune {number}: the client failed at concurrency {c} ({progress})", fg="red")
                return search.Trial(levels, stopped=True)
            stand_in.append("lab_speed_model" in measured["server_info"])
            levels[c] = report.figures(c, measured["level"], watts)
            if c == goal.concurrency and search.behind(goal.value(search.Trial(levels)) or 0.0, bar,
                                                      bench.requests_at(c)):
                host.log(f"tune {number}: {point.label}: clearly behind the leader at concurrency {c}, stopped")
                return search.Trial(levels, stopped=True)
        return search.Trial(levels)

    def progress(number, point, trial):
        f = trial.levels.get(goal.concurrency)
        host.log(f"tune {number}: {point.label}: " + (f"{f.throughput:.1f} output tok/s, TTFT {f.ttft_ms:.0f} ms, "
                                                      f"TPOT {f.tpot_ms:.2f} ms at concurrency {goal.concurrency}"
                                                      if f else "no figures"))

    result_trials: list = []
    remote.run_directory(host, d.engine.user, remote_root)
    result, failed = None, []
    try:
        anchor = next((p for p in points if p.deployment.engine.speculative == d.engine.speculative
                       and p.shape == (d.engine.tp_size, len(d.replicas))), None)
        result = search.search(points, lambda p, bar: measure(p, bar), goal, plan.search, anchor,
                               lambda n, p, t: (result_trials.append(p), progress(n, p, t)))
    except sweep.Interrupted:
        host.log_styled("tune interrupted: stopping the client, starting the deployed service again", fg="yellow")
        failed.append("interrupted")
    finally:
        sweep.uninterruptible()  # a second Ctrl+C now exits pyinfra
        back = units.restore(host, deployed, remote_root, ready_s, serving)
    failed += behind_gateway.back_in_gateways(host, back, rejoin)
    if result is None:
        return False
    return _kept(host, d, result, plan, out, any(stand_in), left_out, tuned_path) and not failed


def _kept(host, d: Deployment, result: search.Result, plan: TunePlan, out, stand_in: bool,
          left_out: list[str], path) -> bool:
    """The table, the plot and the pick: printed, written beside the bench's results and to the site."""
    labels = [p.label for p, _ in result.trials]
    settings = [p.settings for p, _ in result.trials]
    written = report.write(result, labels, settings, plan.search, out, f"{host.name} · {d.engine.profile_name}",
                           stand_in, left_out)
    host.log(report.table(result, labels))
    host.log(report.comparison(result, labels))
    host.log_styled(f"tune results: {', '.join(str(p) for p in written)}"
                    + (f" ({report.STAND_IN_LABEL})" if stand_in else ""), fg="green")
    if result.winner is None:
        host.log_styled("tune: no candidate met the limits: nothing written", fg="red")
        return False
    pick = result.winner[0]
    served = pick.deployment  # the pick's profile: its build and drafter are what it was measured with
    measured_with = {**tuned.deployed_with(sglang_build(served.engine.sglang_requirement), served.weights.drafter),
                     "prompts": plan.prompts_digest}
    try:
        site_data.write_tuned(path, tuned.document(path, pick.settings, measured_with,
                                              report.kept(result, labels, settings, plan.search)))
    except (ValueError, OSError) as problem:
        host.log_styled(f"tune: the pick was not written to {path}: {problem}", fg="red")
        return False
    host.log_styled(f"tune: {pick.label} written to {path}; the next deploy serves it", fg="green")
    return True
