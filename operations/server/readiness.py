"""Proof that the server generates, with a bounded wait that shows the load and stops at a crash loop."""

import json
import re
import shlex

from pyinfra import host
from pyinfra.api import FactBase, FunctionCommand, operation
from pyinfra.api.operation import OperationMeta

from deployment.server.config import Server, ServiceHost
from deployment.server.speculative import AR
from operations.basics import gathering, outcomes, polling, shell
from operations.basics.units import any_change
from operations.basics.untrusted import printable
from operations.server.host_scripts.engine_answers import scrubbed
from operations.server.unit import Replacement, restore_command

# The default time a (re)start may take: a fixed start-up (CUDA graphs, warm-up) plus the weights
# read at a rate a cold start of Kimi K2.6 (595 GB onto 8 GPUs, from NVMe) stays above: ~30 min.
READY_BASE_S = 300
LOAD_BYTES_PER_S = 400e6
DEATHS = 3  # a server that died this often since the restart is crash-looping
USAGE_ERROR = "2"  # argparse's exit status: a configuration SGLang refuses, never fixed by restarting
PROGRESS_EVERY_S = 30
# What SGLang (0.5.x) logs while it loads: weights, shards, distributed init, KV cache, CUDA graphs.
LOAD_PROGRESS = re.compile(r"Load weight|Loading safetensors|Init torch distributed|KV Cache is allocated|"
                           r"Capture cuda graph|Capturing batches|fired up and ready")


def ready_timeout(total_bytes: int) -> int:
    """The default readiness timeout for weights of `total_bytes` (READY_BASE_S + LOAD_BYTES_PER_S)."""
    return int(READY_BASE_S + total_bytes / LOAD_BYTES_PER_S)


def timeout_for(service: ServiceHost, weight_bytes: int) -> int:
    """How long a start of a server of the host may take: its ready_timeout_s, else from the size of the
    weights it loads (the deploy's readiness and the benchmark's modes alike)."""
    return service.ready_timeout_s or ready_timeout(weight_bytes)


class ServerProbe(FactBase):
    """
    One readiness probe of the local server (host_scripts/probe_server.py): health, a completion, accept length.

    .. code:: python

        {"ready": True, "generated": True, "completion": "...", "algorithm": "DFLASH", "num_draft_tokens": 8,
         "accept_length": 3.45, "max_total_num_tokens": 222016}
    """

    host_answer = "probe_server.answer"
    host_answer_how = "background"  # it waits on the server: read the rest meanwhile

    def command(self, install_dir: str, port: int, model: str, key_file: str, service_user: str) -> str:
        return " ".join(shlex.quote(part) for part in (
            "python3", f"{install_dir}/bin/probe_server.py", str(port), model, key_file, service_user)) + " 2>&1 || true"

    def process(self, output):
        # What the deploy logs and keeps of the server's answers, its secrets masked.
        try:
            return scrubbed(json.loads(output[-1]))
        except (IndexError, ValueError):
            return {"ready": False, "error": scrubbed(" ".join(output)[-200:])}


class ServiceRun(FactBase):
    """
    The service's current run as systemd sees it, and the last load-progress line of its journal.

    .. code:: python

        {"active": "activating", "sub": "auto-restart", "result": "exit-code", "restarts": 2,
         "exit_status": "1", "progress": "Capture cuda graph begin. This can take up to several minutes."}
    """

    def command(self, service: str) -> str:
        unit = shlex.quote(service)
        return (f"systemctl show {unit} -p ActiveState,SubState,Result,NRestarts,ExecMainStatus; "
                # This run's lines only: an earlier run's "ready" is no progress of this one.
                f"echo \"Progress=$(journalctl _SYSTEMD_INVOCATION_ID=$(systemctl show -p InvocationID --value {unit}) "
                f"-n 200 -o cat --no-pager "
                f"| grep -E {shlex.quote(LOAD_PROGRESS.pattern)} | tail -1 | tr -d '\\r' | cut -c1-160)\"")

    def process(self, output):
        shown = dict(line.split("=", 1) for line in output if "=" in line)
        return {"active": shown.get("ActiveState"), "sub": shown.get("SubState"), "result": shown.get("Result"),
                "restarts": int(shown.get("NRestarts") or 0), "exit_status": shown.get("ExecMainStatus"),
                "progress": shown.get("Progress") or None}


def crash(run: dict, restarts_before: int) -> str | None:
    """Why waiting longer will not make the server ready (it crash-loops, or SGLang refused its
    configuration), or None while it may still come up."""
    # systemd counts restarts (a manual one does not reset it); a run waiting for its restart died too.
    deaths = run["restarts"] - restarts_before + (run["sub"] == "auto-restart")
    if run["active"] == "failed":
        return f"the service failed ({run['result']}, exit status {run['exit_status']})"
    if run["sub"] == "auto-restart" and run["exit_status"] == USAGE_ERROR:
        return "SGLang refused its arguments (exit status 2)"
    if deaths >= DEATHS:
        return f"the server died {deaths} times since the restart (last exit status {run['exit_status']})"
    return None


@operation()
def ready(server: Server, restarted: OperationMeta, timeout_s: int, replacement: Replacement | None = None):
    """
    Prove the server generates: /ready (else /health_generate), one chat completion, the speculative accept length.

    After a (re)start it waits, printing the load's progress from the journal; if the server
    crash-loops or is not ready within `timeout_s` it restores the previous unit and restarts it, or
    where the run replaces units of the host (``replacement``), stops every new replica and brings the
    replaced units back; then it fails with the journal.

    + server: the host's server
    + restarted: the operation that may have (re)started the service
    + timeout_s: how long a start may take (see ready_timeout)
    + replacement: the host's change of units in this run (``unit.Replacement``)

    **Example:**

    .. code:: python

        readiness.ready(name="Wait until SGLang generates", server=server, restarted=unit, timeout_s=1800,
                        replacement=replacement)
    """
    if not any_change([restarted]):
        probe = gathering.read(ServerProbe, **probe_args(server)) or {}
        if generates(probe):
            log_serving(host, probe, server.service_name)
            host.noop(f"serving {served_algorithm(probe)}: accept length {probe.get('accept_length')}")
            return
    yield FunctionCommand(wait_ready, (server, timeout_s, replacement), {})


def probe_args(server: Server) -> dict:
    """ServerProbe's arguments for `server`: where its host keeps the probe and the key, its port and
    model, and the user whose socket it must be (its deployment's)."""
    h = server.engine.service
    return dict(install_dir=h.install_dir, port=server.port, model=server.engine.served_model_name,
                key_file=h.api_key_file, service_user=server.engine.user)


def log_serving(host, probe: dict, replica: str) -> None:
    """The generating server's speculative settings and KV pool as its /server_info reported them ("unread"
    where that answer failed after the completion: the server generates all the same)."""
    algorithm = served_algorithm(probe)
    engine = probe.get("max_total_num_tokens")
    outcomes.note(host, serving=algorithm, accept_length=probe.get("accept_length"))
    outcomes.note_replica(host, "kv_engine", replica, engine if isinstance(engine, int) else None)
    unread = f" (/server_info: {printable(probe['error'])})" if "algorithm" not in probe and probe.get("error") else ""
    pool = f"KV cache {engine:,} tokens" if isinstance(engine, int) else "KV cache unread"
    host.log_styled(f"serving {algorithm}{unread} (draft tokens {probe.get('num_draft_tokens')}): accept length "
                    f"{probe.get('accept_length')}; {pool}; completion: {probe['completion']!r}", fg="green")


def served_algorithm(probe: dict) -> str:
    """The algorithm a generating server reported: AR where /server_info names none (SGLang's
    speculative_algorithm is None without speculation), "unread" where that answer failed."""
    if "algorithm" not in probe:
        return "unread"
    return probe["algorithm"] or AR.name


def generates(probe: dict) -> bool:
    """The probe saw the server healthy and generating (a completion that generated, its reasoning
    counting: host_scripts/engine_answers.py)."""
    return bool(probe.get("ready") and probe.get("generated"))


def watch(host, server: Server, timeout_s: float, what: str, interval_s: float,
          service: str | None = None) -> tuple[dict, str | None]:
    """Probe the server until it generates, its unit (`service`, else the server's) crash-loops or
    `timeout_s` passes: (last probe, crash or None)."""
    return watch_unit(host, probe_args(server), service or server.service_name, timeout_s, what, interval_s)


def watch_unit(host, probe: dict, service: str, timeout_s: float, what: str,
               interval_s: float) -> tuple[dict, str | None]:
    """``watch`` of the unit `service` whose server ``ServerProbe`` reaches with the arguments `probe`."""
    probe_command = ServerProbe().command(**probe)
    run_command = ServiceRun().command(service)
    last = {"probe": {"ready": False}, "crash": None}

    def check(elapsed: float):
        _, output = shell.run(host, run_command)
        run = ServiceRun().process(output.stdout_lines)
        last.setdefault("restarts_before", run["restarts"])
        last["crash"] = crash(run, last["restarts_before"])
        if last["crash"]:
            return False, ""
        _, output = shell.run(host, probe_command)
        last["probe"] = ServerProbe().process(output.stdout_lines)
        if generates(last["probe"]):
            return True, ""
        return None, (f"{what}: {elapsed:.0f}s of {timeout_s:.0f}s, {run['active']}/{run['sub']}, "
                      f"restarts {run['restarts'] - last['restarts_before']}: "
                      f"{printable(run['progress'] or last['probe'].get('error', 'not ready'))}")

    polling.wait(host, check, interval_s=interval_s, log_every_s=PROGRESS_EVERY_S, timeout_s=timeout_s,
              first_log_s=10)
    return last["probe"], last["crash"]


def wait_ready(state, host, server: Server, timeout_s: int, replacement: Replacement | None = None,
               interval_s: float = 2.0) -> bool:
    """Wait for the (re)started server to generate; else restore what served before (its previous unit, or
    the units the run replaces) and prove it serves."""
    probe, crashed = watch(host, server, timeout_s, f"waiting for {server.service_name} to generate", interval_s)
    if generates(probe):
        log_serving(host, probe, server.service_name)
        return True

    _, journal = shell.run(host, f"journalctl -u {server.service_name} -n 25 --no-pager -o cat")
    if replacement is not None and replacement.replaced():
        outcome = _replaced_restored(state, host, server, replacement, min(timeout_s, 120), interval_s)
    else:
        outcome = _previous_restored(host, server, min(timeout_s, 120), interval_s)
    cause = (f"{server.service_name} crash-loops: {crashed}" if crashed else
             f"{server.service_name} did not generate within {timeout_s}s "
             f"({printable(probe.get('error', 'not ready'))})")
    host.log_styled(f"{cause}; {outcome}. Last lines of its journal (journalctl -u {server.service_name}):\n"
                    f"{journal.stdout}", fg="red")
    return False


def _previous_restored(host, server: Server, timeout_s: float, interval_s: float) -> str:
    """Put back the server's previous unit and wait for it to generate: what happened, said."""
    restored, _ = shell.run(host, restore_command(server))
    if not restored:
        return "no previous unit to restore"
    # The previous unit served before this deploy: it should be back within a normal start.
    again, _ = watch(host, server, timeout_s, f"waiting for the restored {server.service_name} to generate", interval_s)
    return ("restored the previous unit, which generates again" if generates(again) else
            f"restored the previous unit, but it does not generate either ({printable(again.get('error', 'not ready'))})")


def _replaced_restored(state, host, server: Server, replacement: Replacement, timeout_s: float,
                       interval_s: float) -> str:
    """Undo the host's change of units: the failed replica's previous unit back where it had one, every new
    replica stopped and removed, the replaced units started; wait for each of those to generate, then
    hand them to ``replacement.on_restored`` (their gateways). What happened, said."""
    new_names = [s.service_name for s in replacement.new()]
    if server.service_name not in new_names:
        shell.run(host, restore_command(server))  # a kept replica changed in the same run
    replaced = replacement.replaced()
    new = ", ".join(new_names)
    ok, output = shell.run(host, replacement.restore_command())
    if not ok:
        return f"stopped {new} but could not start {', '.join(replaced)} again ({printable(output.stderr)[-200:]})"
    failing = []
    for name, found in replaced.items():
        if not (found["port"] and found["model"]):
            continue  # a node group's rank >= 1 serves no HTTP: started is all it shows here
        h = server.engine.service
        again, _ = watch_unit(host, dict(install_dir=h.install_dir, port=found["port"], model=found["model"],
                                         key_file=h.api_key_file, service_user=found["user"] or h.service_user),
                              name, timeout_s, f"waiting for the restored {name} to generate", interval_s)
        if not generates(again):
            failing.append(f"{name} ({printable(again.get('error', 'not ready'))})")
    if failing:
        return f"stopped {new} and started the units it replaces again, but {', '.join(failing)} does not generate"
    back = [sentence for restored in replacement.on_restored if (sentence := restored(state, host))]
    return (f"stopped {new} and restored the units it replaces ({', '.join(replaced)}), which generate again"
            + "".join(f"; {sentence}" for sentence in back))


@gathering.wants
def _read(deployment) -> gathering.Wanted:
    return [(ServerProbe, probe_args(r)) for r in deployment.replicas]
