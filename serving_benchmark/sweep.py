"""Serving benchmark of what was deployed: each mode (ar, dflash, ddtree) served in turn, a concurrency
sweep with aiperf next to the server, results and a regression gate on the controller (bench.py).

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
alone, then against all of them at once, the client spreading its requests round robin over them as
the gateway's round_robin policy does: the host's figures (the summary's modes, table, plots and gate).

Then, the deployed replicas serving again and back in their gateways, each level runs through every
gateway of their model whose only workers of it they are (`gateway_problem`): the deployed
configuration as its clients get it, with the API key (the summary's gateways).
"""

import dataclasses
import json
import re
import shlex
import signal
import subprocess
import tarfile
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import gevent
from pyinfra import host
from pyinfra.api import FunctionCommand, operation
from pyinfra.api.operation import OperationMeta

from serving_benchmark import behind_gateway, report
from operations.server.config import Server, Speculative
from operations.basics import knobs, shell
from operations.basics.host_programs import inline
from operations.basics.knobs import BadHostData
from operations.gpu import smoke as gpu_smoke
from operations.gateway.membership import Route
from operations.gpu.facts import NvidiaGpus
from operations.gpu.smoke import SmokeTest
from operations.server import readiness
from operations.server.flags import ddtree_target_backend, server_args
from operations.server.host_scripts.engine_answers import scrubbed
from operations.server.sandbox import keyless, rejection, service_settings
from operations.basics.templates import render
from operations.weights.checks import WeightsDisk

REPO = Path(__file__).resolve().parent.parent
RESULTS_DIR = re.compile(r"[A-Za-z0-9._/-]+")
BENCH_UNIT = "specfleet-bench"
ALL = "all"  # the results of every replica at once (raw/all/...)
RUNS = f"/var/lib/{BENCH_UNIT}"  # root's: each run's directory in it is the service user's
ARCHIVE = f"{RUNS}/level.tar.gz"  # a level's results as the service user archived them, root's file
CLIENT_UNIT = f"{BENCH_UNIT}-client"  # the client of the level running (one at a time on a host)
CLIENT_REQUIREMENT = "aiperf==0.13.0"
STARTED = datetime.now(timezone.utc)  # one run id for every host of this pyinfra run
DEFAULTS = dict(modes="ar,dflash,ddtree", concurrency="1,4,16,64", output_tokens=256,
                max_throughput_drop=0.10, max_accept_drop=0.2, results_dir="bench-results")
# The default workload: 20 prompts written for this benchmark (6 chat, 6 code, 5 reasoning and 3 long-context
# ones of 1,500-2,400 words: a module to review, a design to summarize, a server to explain), because the
# drafter's accept length depends on what is asked: random tokens tell nothing about it.
PROMPTS = REPO / "serving_benchmark" / "prompts.jsonl"
# Knobs bench.py no longer takes, with the sentence that says what replaced them.
RETIRED = {"input_tokens": "the prompts' own lengths count: give a prompts file (prompts=FILE, JSON lines with "
                           "a \"text\" each)",
           "force": "a worker behind a gateway is drained from it before its sweep and registered again after"}
# The client: aiperf's command line run in this process, with the API key from the file its first
# argument names (none for "" or a server without a key file), read here: the key is never an
# argument of any process, and aiperf writes it into no result.
_CLIENT = (
    "import sys\nfrom pathlib import Path\nfrom aiperf.cli import app\n"
    "key = Path(sys.argv[1]).read_text().strip() if sys.argv[1] and Path(sys.argv[1]).is_file() else ''\n"
    "sys.exit(app([*sys.argv[2:], *(['--api-key', key] if key else [])]))\n"
)


@dataclass(frozen=True)
class Plan:
    """What bench.py was asked for (`--data key=value`), validated."""

    modes: tuple[str, ...]
    concurrency: tuple[int, ...]
    requests: int | None  # per level; None: max(16, 4 x concurrency)
    prompts: Path  # JSON lines on the controller, each {"text": ...} (aiperf's single_turn dataset)
    prompt_count: int
    output_tokens: int
    tokenizer: str  # "target" (the model's own, from its weights directory) or a controller directory
    results_dir: Path
    baseline: Path | None
    max_throughput_drop: float
    max_accept_drop: float

    def requests_at(self, concurrency: int) -> int:
        return self.requests or max(16, 4 * concurrency)


def _integers(name: str, value) -> tuple[int, ...]:
    """A comma-separated list of positive whole numbers, sorted, each once."""
    items = str(value).replace(" ", "").split(",")
    return tuple(sorted({knobs.integer(f"{name} (in {value!r})", item, minimum=1, maximum=99999) for item in items}))


def plan(data) -> Plan:
    """The benchmark knobs of `host.data` (strings from --data, or group data), parsed and checked through
    knobs: a bad value raises BadHostData naming the knob, the value and what is accepted."""
    def get(key):
        value = data.get(key)
        return DEFAULTS.get(key) if value is None else value

    for key, instead in RETIRED.items():
        if data.get(key) is not None:
            raise BadHostData(f"{key}={data.get(key)!r} is not accepted: {instead}")
    modes = tuple(dict.fromkeys(str(get("modes")).replace(" ", "").split(",")))
    if not modes or any(mode not in report.MODES for mode in modes):
        raise BadHostData(f"modes={get('modes')!r} is not accepted: use a comma-separated list of "
                          f"{', '.join(report.MODES)}")
    baseline = data.get("baseline")
    if baseline is not None and not Path(str(baseline)).is_file():
        raise BadHostData(f"baseline={baseline!r} is not accepted: use an earlier run's summary.json on the "
                          "controller")
    tokenizer = str(data.get("bench_tokenizer") or "target")
    if tokenizer != "target" and not (REPO / tokenizer / "tokenizer.json").is_file():
        raise BadHostData(f"bench_tokenizer={tokenizer!r} is not accepted: use 'target' or a controller directory "
                          "holding tokenizer.json")
    requests = data.get("requests")
    prompts = Path(str(data.get("prompts") or PROMPTS)).expanduser().absolute()
    return Plan(
        modes=modes, concurrency=_integers("concurrency", get("concurrency")),
        requests=knobs.integer("requests", requests, minimum=1) if requests is not None else None,
        prompts=prompts, prompt_count=prompt_count(prompts),
        output_tokens=knobs.integer("output_tokens", get("output_tokens"), minimum=1),
        tokenizer=tokenizer, results_dir=Path(knobs.matching("results_dir", str(get("results_dir")), RESULTS_DIR,
                                                             "a relative or absolute directory name")),
        baseline=Path(str(baseline)) if baseline is not None else None,
        max_throughput_drop=knobs.fraction("max_throughput_drop", get("max_throughput_drop")),
        max_accept_drop=knobs.number("max_accept_drop", get("max_accept_drop")),
    )


def prompt_count(path: Path) -> int:
    """How many prompts a prompts file holds: JSON lines, each an object with a non-empty "text" (aiperf's
    single_turn dataset; other keys of that format pass through), checked before any host is touched."""
    accepted = 'a file of JSON lines, each {"text": "..."}'
    try:
        lines = [line for line in path.read_text().splitlines() if line.strip()]
    except (OSError, UnicodeDecodeError) as error:
        raise BadHostData(f"prompts={str(path)!r} is not accepted: use {accepted} ({type(error).__name__})") from None
    for number, line in enumerate(lines, 1):
        try:
            prompt = json.loads(line)
        except ValueError:
            prompt = None
        if not isinstance(prompt, dict) or not isinstance(prompt.get("text"), str) or not prompt["text"].strip():
            raise BadHostData(f"prompts={str(path)!r} is not accepted: line {number} is not a JSON object with a "
                              f"non-empty \"text\": use {accepted}")
    if not lines:
        raise BadHostData(f"prompts={str(path)!r} is not accepted: it holds no prompt; use {accepted}")
    return len(lines)


def _speculative(server: Server, mode: str) -> Speculative:
    spec = server.speculative
    if mode == "dflash":
        return Speculative("DFLASH", spec.num_draft_tokens, draft_window_size=spec.draft_window_size)
    budget = spec.num_draft_tokens - 1 if spec.ddtree_budget is None else spec.ddtree_budget
    return Speculative("DDTREE", spec.num_draft_tokens, ddtree_budget=budget)


def mode_args(server: Server, mode: str) -> list[str]:
    """The deployed server's arguments for `mode`, served on loopback only.

    ar drops every speculative flag; dflash and ddtree keep the deployed drafter and block size
    (ddtree's budget defaults to block - 1, spine mode; it needs one-token pages, and triton where it builds a tree).
    """
    d = dataclasses.replace(server, bind_address="127.0.0.1")
    if mode == "ar":
        args, drop = [], False
        for arg in server_args(d):
            if drop:
                drop = False
            elif arg.startswith("--speculative-"):
                drop = True  # every speculative flag takes a value
            else:
                args.append(arg)
        return args
    spec = _speculative(server, mode)
    if mode == "ddtree":
        d = dataclasses.replace(d, attention_backend=ddtree_target_backend(d.attention_backend, spec.num_draft_tokens,
                                                                           spec.ddtree_budget))
    args = server_args(dataclasses.replace(d, speculative=spec))
    if mode == "ddtree" and "--page-size" not in args:
        args += ["--page-size", "1"]
    return args


def bench_unit(server: Server, several: bool) -> str:
    """The transient unit standing in for a replica's unit: `specfleet-bench`, or with several replicas
    one for each, named after the replica (sglang@qwen36_ddtree-gpu3: specfleet-bench-qwen36_ddtree-gpu3)."""
    return f"{BENCH_UNIT}-{server.service_name.partition('@')[2]}" if several else BENCH_UNIT


def switching(unit: str) -> str:
    """Present while the sweep itself stops the bench unit (its ExecStopPost then leaves the deployed one)."""
    return f"/run/{unit}.switching"


def unit_environment(server: Server) -> dict[str, str]:
    """The deployed unit's environment (its GPUs included), less the key files: the bench server listens
    on loopback only, keyless (its /flush_cache too)."""
    text = render("server/sglang.env.j2", s=server, env={**server.env, **server.gpu_env})
    pairs = (line.split("=", 1) for line in text.splitlines() if "=" in line and not line.startswith("#"))
    return {k: v for k, v in pairs if k not in ("SPECFLEET_API_KEY_FILE", "SPECFLEET_ADMIN_API_KEY_FILE")}


@operation()
def tokenizer(server: Server, source: str):
    """
    Upload the benchmark's tokenizer (a controller directory with tokenizer.json) next to the client.

    Only for hosts whose model tokenizer the client cannot load (the lab's tiny models);
    ``source="target"`` (the default) uses the model's own tokenizer and uploads nothing.

    + server: the host's server (install directory)
    + source: "target" or a directory, relative to the repository, holding tokenizer.json

    **Example:**

    .. code:: python

        sweep.tokenizer(name="Benchmark tokenizer", server=s, source="lab/sglang_standin/bench_tokenizer")
    """
    if source == "target":
        host.noop("the client reads the model's own tokenizer")
        return
    for path in sorted((REPO / source).glob("*.json")):
        yield from shell.put(src=str(path), dest=f"{server.install_dir}/bench/tokenizer/{path.name}",
                                    mode="644")


@operation()
def prompts(server: Server, plan: Plan):
    """
    Upload the benchmark's prompts file next to the client (root's directory): 0640 root:<service user's
    group>, the operator's prompts readable by the client and no other local user.

    + server: the host's server (install directory)
    + plan: the benchmark's plan (its prompts file on the controller)

    **Example:**

    .. code:: python

        sweep.prompts(name="Benchmark prompts", server=s, plan=sweep.plan(host.data))
    """
    yield from shell.put(src=str(plan.prompts), dest=prompts_path(server), user="root",
                                group=server.service_user, mode="640")


def prompts_path(server: Server) -> str:
    return f"{server.install_dir}/bench/prompts.jsonl"


def client_tokenizer(server: Server, source: str) -> list[str]:
    if source == "target":
        trust = ["--tokenizer-trust-remote-code"] if "--trust-remote-code" in server.extra_args else []
        return ["--tokenizer", server.model_dir, *trust]
    return ["--tokenizer", f"{server.install_dir}/bench/tokenizer"]


@operation(is_idempotent=False)
def sweep(replicas: tuple[Server, ...], plan: Plan, smoke: SmokeTest | None = None,
          routes: list | None = None, drained: list[OperationMeta | None] | None = None, results_subdir: str = ""):
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

    **Example:**

    .. code:: python

        sweep.sweep(name="Benchmark sweep", replicas=d.replicas, plan=sweep.plan(host.data), smoke=d.smoke,
                    routes=routes, drained=drained)
    """
    if smoke is not None:  # the environment the deployed units have, P2P decision included
        decided = gpu_smoke.decided_env(smoke)
        replicas = tuple(dataclasses.replace(r, env={**r.env, **decided}) for r in replicas)
    server = replicas[0]
    modes = {}
    for mode in plan.modes:
        args = mode_args(server, mode)
        # As the deploy validates: the service user, offline, with the unit's environment (the replicas'
        # command lines differ in their port only).
        rejected = rejection(host, server, args)
        if rejected and mode == "ddtree":
            modes[mode] = {"skipped": f"ddtree skipped: no DDTree build is deployed (the SGLang in "
                                      f"{server.venv} rejects its flags: {rejected})"}
        elif rejected:
            modes[mode] = {"skipped": f"{mode} skipped: the SGLang in {server.venv} rejects its flags: {rejected}"}
        else:
            modes[mode] = {"server_args": args}
    gpus = host.get_fact(NvidiaGpus)
    # How long a mode (and the deployed service after) may take to start: as the deploy allows it, from
    # ready_timeout_s or the size of the weights on the host.
    disk = host.get_fact(WeightsDisk, local_dirs=(server.model_dir, server.draft_model_dir))
    ready_s = readiness.timeout_for(server, sum(sum((d or {}).get("files", {}).values()) for d in disk.values()))
    rejoin = list(zip(routes or [[] for _ in replicas], drained or [None for _ in replicas]))
    yield FunctionCommand(run_sweep, (tuple(replicas), plan, modes, gpus, ready_s, rejoin, results_subdir), {})


def _run(host, command: str) -> tuple[bool, str]:
    ok, output = shell.run(host, command)
    return ok, output.stdout


def _as_user(user: str, command: str) -> str:
    """`command` run as `user`: what touches the client's directory (which that user can write) never runs as root."""
    return f"runuser -u {shlex.quote(user)} -- sh -c {shlex.quote(command)}"


def _server(host, d: Server, path: str, method: str = "GET", key_file: str = "") -> str:
    """One request to replica `d`'s port on its host (host_scripts/server_request.py), its body or "" on an
    error: a bench unit takes no key; a deployed unit takes the key in `key_file`, read on the host (its API
    key, or on an admin-optional route such as /flush_cache its worker admin key)."""
    command = inline("server_request", str(d.port), path, method, d.service_user, *([key_file] if key_file else []))
    ok, out = _run(host, command)
    return out if ok else ""


def bench_unit_command(d: Server, args: list[str], max_runtime_s: int, unit: str = BENCH_UNIT) -> list[str]:
    """systemd-run's command line for the bench unit `unit` serving `args` in replica `d`'s place: the
    deployed unit's user and confinement (``sandbox.service_settings``), keyless: its environment (its
    GPUs) less the API key file, the configuration directory out of its reach; a time limit, and on stop (the limit, or the sweep's own stop) the deployed unit started again unless the
    sweep is switching modes. ExecStopPost runs as root (+): the service user may not start a system unit."""
    restore = f"+/bin/sh -c 'test -e {switching(unit)} || systemctl start --no-block {d.service_name}'"
    setenv = [f"--setenv={k}={v}" for k, v in unit_environment(d).items()]
    return ["systemd-run", f"--unit={unit}", "--collect",
            f"--description=specfleet serving benchmark of {d.service_name}",
            *(f"--property={setting}" for setting in (*service_settings(d), *keyless(d))),
            f"--property=RuntimeMaxSec={max_runtime_s}", f"--property=ExecStopPost={restore}", *setenv,
            f"{d.venv}/bin/python", f"{d.install_dir}/bin/launch_sglang.py", *args]


def _start_mode(host, replicas: tuple[Server, ...], mode: str, max_runtime_s: int) -> tuple[bool, str]:
    """Stop whatever serves (the deployed replicas or the previous mode) and start a bench unit with the
    mode's arguments in each replica's place."""
    several = len(replicas) > 1
    units = [bench_unit(d, several) for d in replicas]
    runs = [" ".join(shlex.quote(a) for a in bench_unit_command(d, mode_args(d, mode), max_runtime_s, unit)) + " 2>&1"
            for d, unit in zip(replicas, units)]
    return _run(host, "; ".join([
        *(f"touch {switching(u)}" for u in units),
        f"systemctl stop {' '.join(d.service_name for d in replicas)} {' '.join(units)} 2>/dev/null",
        f"systemctl reset-failed {' '.join(units)} 2>/dev/null", f"rm -f {' '.join(switching(u) for u in units)}",
        " && ".join(runs)]))


def _restore(host, replicas: tuple[Server, ...], remote_root: str, timeout_s: int) -> list[tuple[Server, dict]]:
    """Stop a client still running, the bench units, and start the deployed replicas; wait until each
    generates. Per replica, its last probe."""
    several = len(replicas) > 1
    units = " ".join(bench_unit(r, several) for r in replicas)
    _clean(host, replicas[0].service_user, remote_root)
    _run(host, f"rm -f {' '.join(switching(bench_unit(r, several)) for r in replicas)}; "
               f"systemctl stop {units} 2>/dev/null; systemctl start {' '.join(r.service_name for r in replicas)}")
    return [(r, readiness.watch(host, r, timeout_s, f"waiting for the deployed {r.service_name} to generate", 2.0)[0])
            for r in replicas]


def _run_directory(host, user: str, remote_root: str) -> None:
    """Root's directory, and in it the run's, which the service user owns (and the client writes in)."""
    _run(host, f"install -d -o root -g root -m 0755 {RUNS} && "
               f"install -d -o {shlex.quote(user)} -g {shlex.quote(user)} -m 0700 {remote_root}")


def _clean(host, user: str, remote_root: str) -> None:
    """Stop a client still running (its unit, every process in it) and remove the run's directory. The
    raw results are on the controller by now: the host keeps nothing of the run. What is in the run's
    directory is the service user's, and that user deletes it; root removes the emptied directory."""
    _run(host, f"systemctl stop {CLIENT_UNIT} 2>/dev/null; "
               f"{_as_user(user, f'find {remote_root} -mindepth 1 -delete')}; "
               f"rmdir {remote_root}; rm -f {ARCHIVE}")


def client_command(d: Server, plan: Plan, remote: str, concurrency: int, urls: list[str],
                   through_gateway: bool = False) -> list[str]:
    """The client's command line at one level: aiperf round robin over `urls` (its --url, once per server),
    through `_CLIENT`; through a gateway, with the deployed units' API key (`d.api_key_file`, read by
    `_CLIENT`) and without aiperf's scrape of the URL's /metrics: smg serves its metrics on a port of its
    own, and aiperf 0.13.0 then may wait for a metrics producer that never reports, and exit 1."""
    return [f"{d.install_dir}/bench-venv/bin/python", "-c", _CLIENT, d.api_key_file if through_gateway else "",
            "profile", "--model", d.served_model_name,
            *(arg for url in urls for arg in ("--url", url)), "--endpoint-type", "chat", "--streaming",
            "--concurrency", str(concurrency), "--request-count", str(plan.requests_at(concurrency)),
            "--warmup-request-count", str(min(concurrency, 4)),
            "--input-file", prompts_path(d), "--custom-dataset-type", "single_turn",
            "--prompt-output-tokens-mean", str(plan.output_tokens), "--prompt-output-tokens-stddev", "0",
            "--extra-inputs", "ignore_eos:true", "--use-server-token-count", "--random-seed", "0",
            *client_tokenizer(d, plan.tokenizer), *(["--no-server-metrics"] if through_gateway else []),
            "--output-artifact-dir", remote, "--no-auto-plot", "--ui-type", "none"]


def level_bound_s(plan: Plan, concurrency: int) -> int:
    """A bound on one level, not an estimate: its requests at 10 tokens/s, one at a time, and a minute."""
    return 60 + plan.requests_at(concurrency) * plan.output_tokens // 10


def client_unit_command(d: Server, plan: Plan, remote: str, concurrency: int, urls: list[str],
                        through_gateway: bool = False) -> list[str]:
    """systemd-run's command line for the client at one level (``client_command``): with tokenizer=target,
    aiperf imports the model's tokenizer code, so it runs as the server does, in a transient unit with
    the replica unit's user and confinement (``sandbox.service_settings``), writing only its level's
    directory; keyless unless through a gateway (whose clients' key it sends), every process stopped
    with it, ended after the level's bound. Of the unit's environment it takes the server's HF_HOME
    alone (where the model's code is cached, written by confined processes only): with HF_HUB_OFFLINE,
    aiperf 0.13.0 looks a local tokenizer directory up as a repo id in the hub's cache, and fails. Its exit status is written without a `$`, which systemd
    would expand in the command line."""
    client = " ".join(shlex.quote(a) for a in client_command(d, plan, remote, concurrency, urls, through_gateway))
    script = f"if {client} > client.log 2>&1; then echo 0 > client.rc; else echo 1 > client.rc; fi"
    settings = (*service_settings(d), *([] if through_gateway else keyless(d)), "KillMode=control-group",
                f"WorkingDirectory={remote}", f"ReadWritePaths={remote}",
                f"RuntimeMaxSec={level_bound_s(plan, concurrency)}")
    return ["systemd-run", f"--unit={CLIENT_UNIT}", "--collect", "--quiet", "--service-type=exec",
            f"--description=specfleet serving benchmark client of {d.service_name}",
            *(f"--property={setting}" for setting in settings),
            f"--setenv=HF_HOME={d.server_hf_home}", "/bin/sh", "-c", script]


def _level(host, d: Server, plan: Plan, remote: str, concurrency: int, urls: list[str],
           through_gateway: bool = False) -> tuple[bool, str]:
    """Run the client at one level in its unit (``client_unit_command``) and log progress until it ends."""
    requests, warmup = plan.requests_at(concurrency), min(concurrency, 4)
    user = d.service_user
    command = " ".join(shlex.quote(a) for a in client_unit_command(d, plan, remote, concurrency, urls, through_gateway))
    ok, said = _run(host, f"{_as_user(user, f'mkdir -p {remote}')} && {{ systemctl reset-failed {CLIENT_UNIT} "
                          f"2>/dev/null; {command} 2>&1; }}")
    if not ok:
        return False, f"the client did not start: {said.strip()}"
    started = last = time.monotonic()
    while True:
        time.sleep(2)
        # The unit first: one that ended has written its status, unless it was stopped or timed out.
        ok, out = _run(host, _as_user(user, f"systemctl is-active -q {CLIENT_UNIT} && echo running || "
                                            f"cat {remote}/client.rc 2>/dev/null || echo ended; "
                                            f"cat {remote}/profile_export.jsonl 2>/dev/null | wc -l"))
        status, records = (out.split() + ["?", "0"])[:2]
        done = max(0, int(records) - warmup) if records.isdigit() else 0  # warmup requests are recorded too
        if status != "running":
            return status == "0", f"{done}/{requests} requests"
        if time.monotonic() - last >= 15:
            host.log(f"  ... {done}/{requests} requests done, {time.monotonic() - started:.0f}s")
            last = time.monotonic()


def _files_only(member: tarfile.TarInfo, path: str) -> tarfile.TarInfo | None:
    """tarfile's `data` filter, and then only directories and regular files: a link or a FIFO the
    service user left in a level's directory is not recreated on the controller."""
    return tarfile.data_filter(member, path) if member.isfile() or member.isdir() else None


def _fetch(host, user: str, remote: str, local: Path) -> None:
    """Bring a level's directory back (one tarball) and unpack it under `local`.

    The service user archives its directory (reading only what it may read, links as links) to
    stdout, which root's shell writes to root's own file: root opens nothing in that user's directory."""
    local.mkdir(parents=True, exist_ok=True)
    tarball = local.with_suffix(".tar.gz")
    _run(host, f"{_as_user(user, f'tar -C {remote} -czf - .')} > {ARCHIVE}")
    shell.get_file(host, ARCHIVE, str(tarball))
    _run(host, f"rm -f {ARCHIVE}")
    try:
        with tarfile.open(tarball) as archive:
            archive.extractall(local, filter=_files_only)
    except (tarfile.TarError, OSError) as error:
        host.log_styled(f"the results of {remote} did not unpack: {error}", fg="red")
    tarball.unlink()


def _server_info(answer: str) -> dict:
    """/server_info's answer as a dict, its secrets masked (the API keys, the launch command's --api-key:
    engine_answers.scrubbed); {} when it is not a JSON object."""
    try:
        info = json.loads(answer or "{}")
    except ValueError:
        return {}
    return scrubbed(info) if isinstance(info, dict) else {}


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


def run_sweep(state, host, replicas: tuple[Server, ...], plan: Plan, modes: dict, gpus, ready_s: int,
              rejoin: list, results_subdir: str) -> bool:
    """The sweep on one host (a FunctionCommand); the deployed replicas are started again whatever happens."""
    if not _SWEEPS:
        signal.signal(signal.SIGINT, _interrupt_sweeps(signal.getsignal(signal.SIGINT)))
    _SWEEPS.add(gevent.getcurrent())
    try:
        return _sweep(host, replicas, plan, modes, gpus, ready_s, rejoin, results_subdir)
    except Interrupted:  # while writing the results: the host is restored already
        return False
    finally:
        _SWEEPS.discard(gevent.getcurrent())


def _measure(host, d: Server, plan: Plan, remote: str, local: Path, where: str, concurrency: int,
             targets: tuple[Server, ...], gateway: str = "") -> tuple[dict | None, str]:
    """One level against `targets` (one replica, or all at once), or through the `gateway` URL to the
    deployed `targets` behind it (with their API key): its level and the first target's /server_info,
    or None; what the client did."""
    deployed = bool(gateway)
    for t in targets:
        # Resets the accept length average; admin-optional in SGLang (http_server.py): the worker admin key.
        _server(host, t, "/flush_cache", "POST", key_file=t.admin_key_file if deployed else "")
    urls = [gateway] if deployed else [f"http://127.0.0.1:{t.port}" for t in targets]
    ok, progress = _level(host, d, plan, remote, concurrency, urls, through_gateway=deployed)
    answers = [_server(host, t, "/server_info", key_file=t.api_key_file if deployed else "") for t in targets]
    _fetch(host, d.service_user, remote, local)
    # The first server's answer, its secrets masked: written here, never into a command on the host.
    infos = [_server_info(answer) for answer in answers]
    try:
        (local / "server_info.json").write_text(json.dumps(infos[0], indent=1) if infos[0] else scrubbed(answers[0]))
    except OSError as error:
        host.log_styled(f"raw/{where}server_info.json not written: {error}", fg="red")
    if not ok or not (local / "profile_export_aiperf.json").is_file():
        return None, progress
    accepts = [(i.get("internal_states") or [{}])[0].get("avg_spec_accept_length") for i in infos]
    averaged = {**infos[0], "internal_states": [{"avg_spec_accept_length": round(sum(accepts) / len(accepts), 4)
                                                 if None not in accepts else None}]}
    level = report.level_result(json.loads((local / "profile_export_aiperf.json").read_text()), averaged)
    return {"level": level, "server_info": infos[0]}, progress


def generated_tokens(metrics: str) -> float:
    """The tokens a server generated since it started: SGLang's `sglang:generation_tokens_total` in its /metrics."""
    return sum(float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines()
               if line.startswith("sglang:generation_tokens_total"))


def gateway_problem(listing: dict, route: Route, replicas: tuple[Server, ...]) -> str | None:
    """Why the figures through `route`'s gateway would not be these replicas' (their host's) alone: the
    gateway did not answer, or its workers of their model are not exactly them (it also routes to
    another host, or lacks one of them), or its inventory name would not make one plain directory of the
    results (on the host and on the controller). None when they are."""
    d = replicas[0]
    if not knobs.UNIT_NAME.fullmatch(route.gateway):
        return (f"its inventory name {route.gateway!r} is not a plain name (letters, digits, _.-), which its "
                "results' directory takes")
    if not route.address:
        return f"its API listens on {route.control.bind_address} only, which this host's client cannot reach"
    if not listing.get("reachable"):
        return f"{route.gateway} did not answer ({listing.get('error', 'unreachable')})"
    listed = {w["url"] for w in listing.get("workers", [])}
    wanted = {route.worker_url(r.port) for r in replicas}
    if listed - wanted:
        others = sorted(listed - wanted)
        return (f"{route.gateway} also routes {d.served_model_name} to {len(others)} other worker(s) "
                f"({', '.join(others[:3])}{', ...' if len(others) > 3 else ''}): its figures would not be this "
                "host's alone")
    if wanted - listed:
        return f"{route.gateway} does not route to {', '.join(sorted(wanted - listed))}"
    return None


def _through_gateways(host, replicas: tuple[Server, ...], plan: Plan, remote_root: str, out: Path,
                      routes: list) -> dict:
    """The deployed replicas, back in their gateways: each level through each gateway of their model
    whose workers of it are exactly them (``gateway_problem``), with their API key, as their clients
    get them (the gateway's policy spreading the requests). Per gateway, its levels and the tokens each
    replica generated meanwhile, or why it was skipped or failed."""
    d = replicas[0]
    mode = d.speculative.algorithm.lower()
    passes = {}
    for route in routes:
        name = route.gateway
        problem = route.problem or gateway_problem(behind_gateway.listing_now(host, route, d.served_model_name), route,
                                                   replicas)
        if problem:
            passes[name] = {"skipped": f"through {name} skipped: {problem}"}
            host.log_styled(passes[name]["skipped"], fg="yellow")
            continue
        url = f"http://{route.address}:{route.port}"
        result = passes[name] = {"url": url, "mode": mode, "levels": {}}
        before = [generated_tokens(_server(host, r, "/metrics", key_file=r.api_key_file)) for r in replicas]
        remote = f"{remote_root}/gateway-{name}"
        _run_directory(host, d.service_user, remote_root)
        try:
            for concurrency in plan.concurrency:
                where = f"gateway-{name}/{mode}/c{concurrency}/"
                host.log(f"bench {mode} through {name}: concurrency {concurrency}, "
                         f"{plan.requests_at(concurrency)} requests over {len(replicas)} replica(s)")
                measured, progress = _measure(host, d, plan, f"{remote}/{mode}/c{concurrency}",
                                              out / "raw" / where.rstrip("/"), where, concurrency, replicas, url)
                if measured is None:
                    result["failed"] = f"the client failed at concurrency {concurrency} (raw/{where}client.log)"
                    host.log_styled(result["failed"], fg="red")
                    break
                level = result["levels"][str(concurrency)] = measured["level"]
                host.log(f"bench {mode} through {name}: concurrency {concurrency}: {level['output_tok_s']:.1f} "
                         f"output tok/s, {level['request_s']:.2f} req/s, accept length {level['accept_length']} "
                         f"({progress})")
        finally:
            _clean(host, d.service_user, remote_root)
        after = [generated_tokens(_server(host, r, "/metrics", key_file=r.api_key_file)) for r in replicas]
        result["generated_tokens"] = {r.service_name: round(a - b) for r, b, a in zip(replicas, before, after)}
        host.log(f"bench through {name}: tokens each replica generated: "
                 + ", ".join(f"{r.service_name} {n}" for r, n in zip(replicas, result["generated_tokens"].values())))
    return passes


def _sweep(host, replicas: tuple[Server, ...], plan: Plan, modes: dict, gpus, ready_s: int, rejoin: list,
           results_subdir: str) -> bool:
    d, several = replicas[0], len(replicas) > 1
    run_id = STARTED.strftime("%Y%m%dT%H%M%SZ")
    out = plan.results_dir / run_id / host.name / results_subdir
    remote_root = f"{RUNS}/{run_id}"
    # Every level's bound, on each replica and then on all of them.
    level_budget_s = sum(level_bound_s(plan, c) for c in plan.concurrency) * (len(replicas) + several)
    out.mkdir(parents=True, exist_ok=True)
    failed, per_replica = [], {}
    _run_directory(host, d.service_user, remote_root)
    try:
        for mode, result in modes.items():
            if "skipped" in result:
                host.log_styled(result["skipped"], fg="yellow")
                continue
            host.log(f"bench {mode}: starting {len(replicas)} server(s) ({' '.join(result['server_args'])})")
            started, said = _start_mode(host, replicas, mode, ready_s + level_budget_s)
            probes = [readiness.watch(host, r, ready_s, f"waiting for {mode} on {r.service_name} to generate", 2.0,
                                      service=bench_unit(r, several))[0] if started else {} for r in replicas]
            if not all(readiness.generates(p) for p in probes):
                _, journal = _run(host, f"journalctl -u {bench_unit(d, several)} -n 15 --no-pager -o cat")
                why = next((p.get("error") for p in probes if not readiness.generates(p)), said.strip())
                result["failed"] = f"{mode} did not start within {ready_s}s ({why or said.strip()})"
                host.log_styled(f"{result['failed']}; its journal:\n{journal}", fg="red")
                failed.append(mode)
                continue
            result["levels"] = {}
            # Each replica alone (several), then every replica at once: the host's levels.
            runs = [*((r.service_name, (r,)) for r in replicas if several), (ALL if several else "", tuple(replicas))]
            for concurrency in plan.concurrency:
                for name, targets in runs:
                    where = f"{name}/" if name else ""
                    host.log(f"bench {mode}: concurrency {concurrency}, {plan.requests_at(concurrency)} requests"
                             + (f" on {name}" if name else ""))
                    measured, progress = _measure(host, d, plan, f"{remote_root}/{where}{mode}/c{concurrency}",
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
        _SWEEPS.discard(gevent.getcurrent())  # a second Ctrl+C now exits pyinfra
        back = _restore(host, replicas, remote_root, ready_s)
    for (replica, probe), (routes, drained) in zip(back, rejoin):
        if not readiness.generates(probe):
            host.log_styled(f"the deployed {replica.service_name} does not generate again ({probe.get('error')}): "
                            f"run the deploy to repair it", fg="red")
            failed.append("restore")
        elif not behind_gateway.join_again(host, replica, routes, drained):  # generating again: back in its gateways
            failed.append("gateway")
    gateways = {}
    if rejoin[0][0] and not {"restore", "gateway", "interrupted"} & set(failed):
        _SWEEPS.add(gevent.getcurrent())  # Ctrl+C stops the client through the gateway, which cleans up
        try:
            gateways = _through_gateways(host, replicas, plan, remote_root, out, rejoin[0][0])
        except Interrupted:
            host.log_styled("bench interrupted through the gateway: the deployed replicas serve", fg="yellow")
            failed.append("interrupted")
        finally:
            _SWEEPS.discard(gevent.getcurrent())
        failed += [f"through {name}" for name, result in gateways.items() if "failed" in result]

    meta = {"host": host.name, "host_class": d.host_class, "profile": d.profile_name, "started": run_id,
            "layout": {"deployment": d.deployment, "tp_size": d.tp_size,
                       "replicas": {r.service_name: list(r.gpus) for r in replicas}},
            "specfleet_commit": specfleet_commit(), "client": CLIENT_REQUIREMENT, "gpus": gpus,
            "workload": {"prompts": plan.prompts.name, "prompt_count": plan.prompt_count,
                         "output_tokens": plan.output_tokens,
                         "requests": {str(c): plan.requests_at(c) for c in plan.concurrency},
                         "endpoint": "/v1/chat/completions (streaming)"}}
    doc = report.summary(meta, modes)
    if several:
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
