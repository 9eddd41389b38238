"""The SGLang systemd unit: written only when its inputs change, validated first, proven by generating."""

import json
import shlex
import time
from io import StringIO
from pathlib import Path

from pyinfra import host
from pyinfra.api import FactBase, FunctionCommand, operation
from pyinfra.api.operation import OperationMeta
from pyinfra.operations import files, server

from operations.deployment import Deployment
from operations.failure import fail_host
from operations.filestate import FileStates, matches, sha1_of
from operations.sglang import rejection, server_args
from operations.venv import fingerprint
from operations.templates import render

HOST_SCRIPTS = Path(__file__).resolve().parent / "host_scripts"
PREVIOUS = ".specfleet-previous"  # suffix of the last unit/env that served


class ServiceState(FactBase):
    """
    The unit and environment files' sha1 (None if absent) and the service's active and enabled state.

    .. code:: python

        {"unit_sha1": "5f1d...", "env_sha1": "9a0b...", "active": "active", "enabled": "enabled"}
    """

    def command(self, unit_file: str, env_file: str, service: str) -> str:
        return "; ".join([
            *(f"(sha1sum {shlex.quote(f)} 2>/dev/null || echo -) | cut -d' ' -f1" for f in (unit_file, env_file)),
            f"systemctl is-active {shlex.quote(service)}",
            f"systemctl is-enabled {shlex.quote(service)} 2>/dev/null || echo disabled",
        ])

    def process(self, output):
        unit, env, active, enabled = [*output, "", "", "", ""][:4]
        return {"unit_sha1": None if unit == "-" else unit, "env_sha1": None if env == "-" else env,
                "active": active, "enabled": enabled}


class ServerProbe(FactBase):
    """
    One readiness probe of the local server (host_scripts/probe_server.py): health, a completion, accept length.

    .. code:: python

        {"ready": True, "completion": "...", "algorithm": "DFLASH", "num_draft_tokens": 8,
         "accept_length": 3.45}
    """

    def command(self, install_dir: str, port: int, model: str, key_file: str) -> str:
        return " ".join(shlex.quote(part) for part in (
            "python3", f"{install_dir}/bin/probe_server.py", str(port), model, key_file)) + " 2>&1 || true"

    def process(self, output):
        try:
            return json.loads(output[-1])
        except (IndexError, ValueError):
            return {"ready": False, "error": " ".join(output)[-200:]}


class SystemUser(FactBase):
    """
    A user's home directory and whether it exists; None when there is no such user.

    .. code:: python

        {"home": "/home/sglang", "home_exists": True}
    """

    def command(self, user: str) -> str:
        return (f"getent passwd {shlex.quote(user)} | cut -d: -f6 | while read -r home; do "
                'if [ -d "$home" ]; then echo "$home yes"; else echo "$home no"; fi; done')

    def process(self, output):
        home, exists = output[0].rsplit(" ", 1)
        return {"home": home, "home_exists": exists == "yes"}


@operation()
def user(user: str, home: str):
    """
    The service's system user, with its home (where HF_HOME lives) and no login shell.

    One fact in the usual case where it exists; pyinfra's server.user does the work otherwise.

    + user: the user name
    + home: its home directory

    **Example:**

    .. code:: python

        service.user(name="Service user", user="sglang", home="/home/sglang")
    """
    existing = host.get_fact(SystemUser, user=user)
    if existing == {"home": home, "home_exists": True}:
        host.noop(f"user {user} exists with home {home}")
        return
    yield from server.user._inner(user=user, system=True, home=home, shell="/usr/sbin/nologin",
                                  ensure_home=True)


@operation()
def host_scripts(deployment: Deployment):
    """
    Upload the host-side scripts: the weights fetcher, the SGLang launcher and the readiness probe.

    + deployment: the host's resolved deployment (install directory)

    **Example:**

    .. code:: python

        service.host_scripts(name="Install specfleet's host scripts", deployment=deployment)
    """
    scripts = {f"{deployment.install_dir}/bin/{script.name}": script for script in sorted(HOST_SCRIPTS.glob("*.py"))}
    states = host.get_fact(FileStates, paths=tuple(scripts))
    stale = {dest: script for dest, script in scripts.items()
             if not matches(states[dest], "file", "755", sha1=sha1_of(script.read_bytes()))}
    if not stale:
        host.noop(f"{len(scripts)} host scripts are current")
    for dest, script in stale.items():
        yield from files.put._inner(src=str(script), dest=dest, mode="755")


def unit_files(deployment: Deployment, inputs: str) -> tuple[str, str]:
    """The rendered unit and environment file; `inputs` names what else forces a restart."""
    d = deployment
    env_text = render("sglang.env.j2", d=d, env=d.env)
    unit_text = render("sglang.service.j2", d=d, args=[shlex.quote(a) for a in server_args(d)],
                       inputs=f"{inputs} env={sha1_of(env_text.encode())[:12]}")
    return unit_text, env_text


@operation()
def configure(deployment: Deployment, inputs: str, restart_when: list[OperationMeta] | None = None):
    """
    Write the SGLang unit and its environment file and (re)start the service, only when they changed.

    The rendered arguments are validated by the SGLang installed on the host first:
    if it rejects them the deploy fails naming the flag, and the running service is
    untouched. The previous files are kept so a failed readiness check can restore them.

    + deployment: the host's resolved deployment
    + inputs: what the server is built from (SGLang fingerprint, weights commits); written into the unit
    + restart_when: other operations (the API key) whose change alone needs a restart

    **Example:**

    .. code:: python

        service.configure(name="Configure the SGLang service", deployment=d, inputs="sglang=3f2a target=ab12")
    """
    d = deployment
    unit_text, env_text = unit_files(d, inputs)
    current = host.get_fact(ServiceState, unit_file=d.unit_file, env_file=d.env_file, service=d.service_name)
    unchanged = current["unit_sha1"] == sha1_of(unit_text.encode()) and current["env_sha1"] == sha1_of(env_text.encode())
    if unchanged:
        # Asked to restart by another operation, or found stopped: converge it.
        if any(op.changed for op in restart_when or []):
            yield f"systemctl restart {d.service_name}"
        elif current["active"] != "active" or current["enabled"] != "enabled":
            yield f"systemctl enable --now {d.service_name}"
        else:
            host.noop(f"{d.service_name} is running its current unit ({inputs})")
        return

    args = server_args(d)
    rejected = rejection(host, d, args)
    if rejected:
        yield fail_host([f"{host.name}: the SGLang in {d.venv} rejects the rendered flags ({rejected}); "
                         f"fix the flag in group_data or the SGLang pin; {d.service_name} was left as it was"])
        return
    for path in (d.unit_file, d.env_file):
        yield f"if [ -f {path} ]; then cp -p {path} {path}{PREVIOUS}; fi"
    yield from files.put._inner(src=StringIO(env_text), dest=d.env_file, mode="644")
    yield from files.put._inner(src=StringIO(unit_text), dest=d.unit_file, mode="644")
    yield "systemctl daemon-reload"
    yield f"systemctl enable {d.service_name}"
    yield f"systemctl restart {d.service_name}"


@operation()
def ready(deployment: Deployment, restarted: OperationMeta, timeout_s: int = 1800):
    """
    Prove the server generates: /health_generate, one chat completion, the speculative accept length.

    After a (re)start it waits (bounded, with progress); if the server never gets
    ready it restores the previous unit, restarts it, and fails with the journal.

    + deployment: the host's resolved deployment
    + restarted: the operation that may have (re)started the service
    + timeout_s: how long a start may take

    **Example:**

    .. code:: python

        service.ready(name="Wait until SGLang generates", deployment=d, restarted=unit)
    """
    d = deployment
    if not restarted.changed:
        probe = host.get_fact(ServerProbe, install_dir=d.install_dir, port=d.port,
                              model=d.served_model_name, key_file=d.api_key_file)
        if probe.get("ready") and probe.get("completion"):
            log_serving(host, probe)
            host.noop(f"serving {probe['algorithm']}: accept length {probe['accept_length']}")
            return
    yield FunctionCommand(wait_ready, (d, timeout_s), {})


def log_serving(host, probe: dict) -> None:
    host.log_styled(f"serving {probe['algorithm']} (draft tokens {probe['num_draft_tokens']}): accept length "
                    f"{probe['accept_length']}; completion: {probe['completion']!r}", fg="green")


def _probe_until_ready(host, deployment: Deployment, timeout_s: float, poll_interval: float,
                       progress: str) -> dict:
    """Probe the local server until it generates or `timeout_s` passes; the last probe."""
    d = deployment
    probe_command = ServerProbe().command(d.install_dir, d.port, d.served_model_name, d.api_key_file)
    started = last_logged = time.monotonic()
    while True:
        _, output = host.run_shell_command(probe_command)
        probe = ServerProbe().process(output.stdout_lines)
        if probe.get("ready") and probe.get("completion"):
            return probe
        if time.monotonic() - started >= timeout_s:
            return probe
        if time.monotonic() - last_logged >= 15:
            host.log(f"{progress}: {time.monotonic() - started:.0f}s of {timeout_s:.0f}s "
                     f"({probe.get('error', 'not ready')})")
            last_logged = time.monotonic()
        time.sleep(poll_interval)


def wait_ready(state, host, deployment: Deployment, timeout_s: int, poll_interval: float = 2.0) -> bool:
    """Wait for the (re)started server to generate; else restore the previous unit and prove it serves."""
    d = deployment
    probe = _probe_until_ready(host, d, timeout_s, poll_interval, f"waiting for {d.service_name} to generate")
    if probe.get("ready") and probe.get("completion"):
        log_serving(host, probe)
        return True

    _, journal = host.run_shell_command(f"journalctl -u {d.service_name} -n 25 --no-pager -o cat")
    restore = " && ".join([
        f"test -f {d.unit_file}{PREVIOUS}",
        *(f"if [ -f {path}{PREVIOUS} ]; then mv {path}{PREVIOUS} {path}; fi" for path in (d.unit_file, d.env_file)),
        "systemctl daemon-reload", f"systemctl restart {d.service_name}",
    ])
    restored, _ = host.run_shell_command(restore)
    if restored:
        # The previous unit served before this deploy: it should be back within a normal start.
        again = _probe_until_ready(host, d, min(timeout_s, 120), poll_interval,
                                   f"waiting for the restored {d.service_name} to generate")
        outcome = ("restored the previous unit, which generates again" if again.get("ready") and
                   again.get("completion") else
                   f"restored the previous unit, but it does not generate either ({again.get('error', 'not ready')})")
    else:
        outcome = "no previous unit to restore"
    host.log_styled(
        f"{d.service_name} did not generate within {timeout_s}s ({probe.get('error', 'not ready')}); {outcome}. "
        f"Last lines of its journal (journalctl -u {d.service_name}):\n{journal.stdout}", fg="red")
    return False


def inputs(deployment: Deployment, snapshots) -> str:
    """What the server is built from besides its unit (SGLang, weights, its launcher): a change restarts it."""
    d = deployment
    launcher = sha1_of((HOST_SCRIPTS / "launch_sglang.py").read_bytes())[:12]
    return (f"sglang={fingerprint(d.sglang_requirement, d.pip_index_url)} "
            f"target={snapshots['target'].commit[:12]} drafter={snapshots['drafter'].commit[:12]} "
            f"launcher={launcher}")
