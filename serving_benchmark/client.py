"""The bench's client: aiperf next to the servers, at one concurrency level, in a transient unit confined
as the replica's unit (it imports the model's tokenizer code); its prompts and tokenizer uploaded next to
it, each level's results brought back and read."""

import json
import shlex
import time
import urllib.parse
from pathlib import Path

from pyinfra import host
from pyinfra.api import operation

from deployment.server.config import Server, ServiceHost
from operations.basics import shell
from operations.python import virtualenvs
from operations.server import sandbox
from operations.server.host_scripts.engine_answers import scrubbed
from serving_benchmark import report
from serving_benchmark.plan import REPO, Plan
from serving_benchmark.remote import CLIENT_UNIT, as_user, fetch, request, run, server_info

CLIENT_REQUIREMENT = "aiperf==0.13.0"
# The client: aiperf's command line run in this process, with the API key from the file its first
# argument names (none for "" or a server without a key file), read here: the key is never an
# argument of any process, and aiperf writes it into no result.
CLIENT = (
    "import sys\nfrom pathlib import Path\nfrom aiperf.cli import app\n"
    "key = Path(sys.argv[1]).read_text().strip() if sys.argv[1] and Path(sys.argv[1]).is_file() else ''\n"
    "sys.exit(app([*sys.argv[2:], *(['--api-key', key] if key else [])]))\n"
)


def installed(service: ServiceHost, plan: Plan) -> None:
    """The client beside the host's servers, one for every deployment: aiperf's venv, the tokenizer and the
    prompts (bench.py's first stage, and tune.py's). The venv is built by the host's uv, as SGLang's is:
    aiperf 0.13.0 and its wheels (1.2 GB) took pip 54 CPU-s and uv 29, bytecode compiled by both
    (2026-12-04, from PyPI, no cache, on the 2-core controller)."""
    uv = virtualenvs.Uv(service.install_dir)
    virtualenvs.uv(name="uv", uv=uv, index_url=service.pip_index_url)  # the deploy's: a no-op on a deployed host
    virtualenvs.requirement(name="Benchmark client (aiperf)", path=f"{service.install_dir}/bench-venv",
                     distribution="aiperf", requirement=CLIENT_REQUIREMENT, index_url=service.pip_index_url, uv=uv)
    tokenizer(name="Benchmark tokenizer", service=service, source=plan.tokenizer)
    prompts(name="Benchmark prompts", service=service, plan=plan)


@operation()
def tokenizer(service: ServiceHost, source: str):
    """
    Upload the benchmark's tokenizer (a controller directory with tokenizer.json) next to the client.

    Only for hosts whose model tokenizer the client cannot load (the lab's tiny models);
    ``source="target"`` (the default) uses the model's own tokenizer and uploads nothing.

    + service: what the host's servers share (its install directory)
    + source: "target" or a directory, relative to the repository, holding tokenizer.json

    **Example:**

    .. code:: python

        client.tokenizer(name="Benchmark tokenizer", service=worker.service,
                         source="lab/sglang_standin/bench_tokenizer")
    """
    if source == "target":
        host.noop("the client reads the model's own tokenizer")
        return
    for path in sorted((REPO / source).glob("*.json")):
        yield from shell.put(src=str(path), dest=f"{service.install_dir}/bench/tokenizer/{path.name}",
                             mode="644")


@operation()
def prompts(service: ServiceHost, plan: Plan):
    """
    Upload the benchmark's prompts file next to the client (root's directory): 0640 root:<service user's
    group>, the operator's prompts readable by the client and no other local user.

    + service: what the host's servers share (its install directory, the service user)
    + plan: the benchmark's plan (its prompts file on the controller)

    **Example:**

    .. code:: python

        client.prompts(name="Benchmark prompts", service=worker.service, plan=plan.plan(host.data))
    """
    yield from shell.put(src=str(plan.prompts), dest=prompts_path(service), user="root",
                         group=service.service_user, mode="640")


def prompts_path(service: ServiceHost) -> str:
    return f"{service.install_dir}/bench/prompts.jsonl"


def client_tokenizer(server: Server, source: str) -> list[str]:
    if source == "target":
        trust = ["--tokenizer-trust-remote-code"] if "--trust-remote-code" in server.engine.extra_args else []
        return ["--tokenizer", server.engine.model_dir, *trust]
    return ["--tokenizer", f"{server.engine.service.install_dir}/bench/tokenizer"]


def client_command(d: Server, plan: Plan, remote: str, concurrency: int, urls: list[str],
                   through_gateway: bool = False) -> list[str]:
    """The client's command line at one level: aiperf round robin over `urls` (its --url, once per server),
    through `CLIENT`; through a gateway, with the deployed units' API key (`d.engine.service.api_key_file`, read by
    `CLIENT`) and without aiperf's scrape of the URL's /metrics: smg serves its metrics on a port of its
    own, and aiperf 0.13.0 then may wait for a metrics producer that never reports, and exit 1."""
    h = d.engine.service
    return [f"{h.install_dir}/bench-venv/bin/python", "-c", CLIENT, h.api_key_file if through_gateway else "",
            "profile", "--model", d.engine.served_model_name,
            *(arg for url in urls for arg in ("--url", url)), "--endpoint-type", "chat", "--streaming",
            "--concurrency", str(concurrency), "--request-count", str(plan.requests_at(concurrency)),
            "--warmup-request-count", str(min(concurrency, 4)),
            "--input-file", prompts_path(h), "--custom-dataset-type", "single_turn",
            "--prompt-output-tokens-mean", str(plan.output_tokens), "--prompt-output-tokens-stddev", "0",
            "--extra-inputs", "ignore_eos:true", "--use-server-token-count", "--random-seed", "0",
            *client_tokenizer(d, plan.tokenizer), *(["--no-server-metrics"] if through_gateway else []),
            "--output-artifact-dir", remote, "--no-auto-plot", "--ui-type", "none"]


def level_bound_s(plan: Plan, concurrency: int) -> int:
    """A bound on one level, not an estimate: its requests at 10 tokens/s, one at a time, and a minute."""
    return 60 + plan.requests_at(concurrency) * plan.output_tokens // 10


def client_unit_command(d: Server, plan: Plan, remote: str, concurrency: int, urls: list[str],
                        minors: tuple[int | None, ...], through_gateway: bool = False) -> list[str]:
    """systemd-run's command line for the client at one level (``client_command``): with tokenizer=target,
    aiperf imports the model's tokenizer code, so it runs as the server does, in a transient unit with
    the replica unit's user and confinement (``sandbox.service_settings``), writing only its level's
    directory; keyless unless through a gateway (whose clients' key it sends), every process stopped
    with it, ended after the level's bound (`minors`: ``sandbox.gpu_minor_numbers``). Of the unit's environment it takes the server's HF_HOME
    alone (where the model's code is cached, written by confined processes only): with HF_HUB_OFFLINE,
    aiperf 0.13.0 looks a local tokenizer directory up as a repo id in the hub's cache, and fails. Its exit status is written without a `$`, which systemd
    would expand in the command line."""
    client = " ".join(shlex.quote(a) for a in client_command(d, plan, remote, concurrency, urls, through_gateway))
    script = f"if {client} > client.log 2>&1; then echo 0 > client.rc; else echo 1 > client.rc; fi"
    keyless = [] if through_gateway else sandbox.keyless(d.engine.service)
    # The unit's IP access list admits loopback: a gateway on another host is admitted by its API's address.
    gateway = [f"IPAddressAllow={urllib.parse.urlsplit(urls[0]).hostname}"] if through_gateway else []
    settings = (*sandbox.service_settings(d, minors), *keyless, *gateway, "KillMode=control-group",
                f"WorkingDirectory={remote}", f"ReadWritePaths={remote}",
                f"RuntimeMaxSec={level_bound_s(plan, concurrency)}")
    return ["systemd-run", f"--unit={CLIENT_UNIT}", "--collect", "--quiet", "--service-type=exec",
            f"--description=specfleet serving benchmark client of {d.service_name}",
            *(f"--property={setting}" for setting in settings),
            f"--setenv=HF_HOME={d.engine.server_hf_home}", "/bin/sh", "-c", script]


def run_level(host, d: Server, plan: Plan, remote: str, concurrency: int, urls: list[str],
              through_gateway: bool = False) -> tuple[bool, str]:
    """Run the client at one level in its unit (``client_unit_command``) and log progress until it ends."""
    requests, warmup = plan.requests_at(concurrency), min(concurrency, 4)
    user = d.engine.user
    command = " ".join(shlex.quote(a) for a in client_unit_command(d, plan, remote, concurrency, urls,
                                                                   sandbox.gpu_minor_numbers(), through_gateway))
    ok, said = run(host, f"{as_user(user, f'mkdir -p {remote}')} && {{ systemctl reset-failed {CLIENT_UNIT} "
                         f"2>/dev/null; {command} 2>&1; }}")
    if not ok:
        return False, f"the client did not start: {said.strip()}"
    started = last = time.monotonic()
    while True:
        time.sleep(2)
        # The unit first: one that ended has written its status, unless it was stopped or timed out.
        ok, out = run(host, as_user(user, f"systemctl is-active -q {CLIENT_UNIT} && echo running || "
                                          f"cat {remote}/client.rc 2>/dev/null || echo ended; "
                                          f"cat {remote}/profile_export.jsonl 2>/dev/null | wc -l"))
        status, records = (out.split() + ["?", "0"])[:2]
        done = max(0, int(records) - warmup) if records.isdigit() else 0  # warmup requests are recorded too
        if status != "running":
            return status == "0", f"{done}/{requests} requests"
        if time.monotonic() - last >= 15:
            host.log(f"  ... {done}/{requests} requests done, {time.monotonic() - started:.0f}s")
            last = time.monotonic()


def measure(host, d: Server, plan: Plan, remote: str, local: Path, where: str, concurrency: int,
            targets: tuple[Server, ...], gateway: str = "") -> tuple[dict | None, str]:
    """One level against `targets` (one replica, or all at once), or through the `gateway` URL to the
    deployed `targets` behind it (with their API key): its level and the first target's /server_info,
    or None; what the client did."""
    deployed = bool(gateway)
    for t in targets:
        # Resets the accept length average; admin-optional in SGLang (http_server.py): the worker admin key.
        request(host, t, "/flush_cache", "POST", key_file=t.engine.admin_key_file if deployed else "")
    urls = [gateway] if deployed else [t.url for t in targets]
    ok, progress = run_level(host, d, plan, remote, concurrency, urls, through_gateway=deployed)
    answers = [request(host, t, "/server_info", key_file=t.engine.service.api_key_file if deployed else "")
               for t in targets]
    fetch(host, d.engine.user, remote, local)
    # The first server's answer, its secrets masked: written here, never into a command on the host.
    infos = [server_info(answer) for answer in answers]
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
