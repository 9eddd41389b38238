"""Rolling reprovisioning behind the real smg, under load: rollout.py one worker at a time.

A bounded load generator sends chat completions through the gateway at a steady rate while a
restart input (an environment value of the unit) changes on every worker. With the drain no
request fails; restarting the same workers one at a time without it (systemd's restart, as the
unit's operation does) makes requests fail (the gateway routes to a server that is shutting down
or starting; its retries and circuit breakers then leave no worker for a while), so the check can fail. A worker failing readiness is rolled back, kept out, and stops the rollout.
Every run of the module routes round robin (SPREAD): the load reaches every worker, so each drain and each
restart meets requests (under cache_aware the load's one prompt prefix stays on one worker, and one suite
run's restarts without the drain saw 298 requests sent, none failed).
Like test_gateway.py, the module adds lab-gateway-1 and puts the shared lab back afterwards.
"""

import ipaddress
import itertools
import json
import os
import signal
import subprocess
import sys
import threading
import time
from urllib.parse import urlsplit

import pytest

from lab import config, fleet
from operations.server.host_scripts.engine_answers import generated
from tests.helpers import (ENV_FILE, LAB_INVENTORY, REPO, SGLANG_UNIT, behind_gateway, main_pid, results_table,
                           run_deploy, write_group_data)
from tests.lab.test_gateway import ADMIN_KEY, EXPOSED, GATEWAY_PORT, KEY, admin_writes, call, gateway_workers

pytestmark = pytest.mark.lab

FAULT_KNOBS = "/etc/specfleet-lab/rollout-fault.json"  # only the victim of the failing rollout has it
# The new servers take SLOW_START_S to load, as a real one takes minutes (stand-in knob startup_delay_s).
SLOW_START = "/etc/specfleet-lab/rollout-slow-start.json"
SLOW_START_S = 8
PROMETHEUS_PORT = 29000  # group_data/gateway.py gateway_prometheus_port
BANNER = "[lab stand-in sglang"  # printed once by every start of the stand-in server
SPREAD = (*EXPOSED, "--data", "gateway_policy=round_robin")  # every run of the module: see the docstring


@pytest.fixture(scope="module")
def fleet_behind_gateway(lab_hosts):
    """(gateway, workers in rollout order): the lab with lab-gateway-1, workers registered with it."""
    with behind_gateway(*SPREAD, key=KEY, admin_key=ADMIN_KEY) as (hosts, first, _):
        assert first.returncode == 0, first.output[-4000:]
        gateway = next(h for h in hosts if h.host_class == "gateway")
        by_name = {h.name: h for h in hosts}
        order = json.loads(subprocess.check_output(
            [sys.executable, "-c", f"import json, rollout; print(json.dumps(rollout.batches({LAB_INVENTORY!r}, 1)))"],
            cwd=REPO, text=True))
        workers = [by_name[name] for [name] in order[:-1]]
        for worker in workers:
            fleet.ssh(worker, f"echo '{{\"startup_delay_s\": {SLOW_START_S}}}' > {SLOW_START}")
        try:
            yield gateway, workers
        finally:
            for worker in workers:
                fleet.ssh(worker, f"rm -f {SLOW_START}")


def restart_input(tmp_path, value: str, knobs_file: str = SLOW_START):
    """A group_data folder that changes the unit's environment (a restart input) on every worker."""
    env = {"SPECFLEET_ROLLOUT": value, "SPECFLEET_SGLANG_KNOBS": knobs_file}
    return write_group_data(tmp_path / value, "all", (
        "profiles = copy.deepcopy(base['profiles'])\n"
        f"profiles['kimi_k26_dflash']['env'] = {env!r}"))


def rollout(group_data, *args: str, timeout_s: float = 600) -> tuple[subprocess.CompletedProcess, float]:
    """rollout.py's run; one that outlasts `timeout_s` is killed with its pyinfra runs (its own session), so
    that none goes on changing the lab under the next test, and fails with what it printed."""
    started = time.monotonic()
    argv = [sys.executable, "rollout.py", LAB_INVENTORY, *args, "--group-data", str(group_data), *SPREAD]
    with subprocess.Popen(argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          start_new_session=True, env={**os.environ, "HF_TOKEN": "hf_lab_granted"}) as process:
        try:
            output, _ = process.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            pytest.fail(f"rollout.py still running after {timeout_s:.0f} s:\n{process.communicate()[0][-6000:]}")
    run = subprocess.CompletedProcess(argv, process.returncode, output, "")
    run.output = output
    return run, time.monotonic() - started


class Load:
    """A bounded load generator: one chat completion through the gateway every `interval_s`, each
    on its own thread, until stopped, `max_requests` sent or `max_s` passed; lab addresses only."""

    def __init__(self, url: str, interval_s: float = 0.25, max_requests: int = 1500, max_s: float = 300,
                 model: str = "kimi-k2.6", key: str = KEY):
        lab_net = ipaddress.ip_network(f"{config.SUBNET}.0.0/16")
        assert ipaddress.ip_address(urlsplit(url).hostname) in lab_net, f"{url} is not a lab address"
        self.url, self.interval_s, self.max_requests, self.max_s = url, interval_s, max_requests, max_s
        self.model, self.key = model, key
        self.results: list[tuple[bool, float, str]] = []  # (ok, seconds, what failed)
        self.stopped = threading.Event()
        self.threads: list[threading.Thread] = []
        self.pacer = threading.Thread(target=self._pace, daemon=True)

    def _one(self, number: int) -> None:
        ask = {"model": self.model, "max_tokens": 16,
               "messages": [{"role": "user", "content": f"rollout request {number}: {number * 7919 % 10007}"}]}
        started = time.monotonic()
        try:
            status, answer = call(self.url, key=self.key, body=ask)
            ok = status == 200 and generated(answer)
            what = "" if ok else f"{status} {json.dumps(answer)[:200]}"
        except Exception as error:  # a reset connection or a timeout is a failed request too
            ok, what = False, f"{type(error).__name__}: {error}"
        self.results.append((ok, time.monotonic() - started, what))

    def _pace(self) -> None:
        deadline = time.monotonic() + self.max_s
        for number in itertools.count():
            if self.stopped.is_set() or number >= self.max_requests or time.monotonic() > deadline:
                return
            thread = threading.Thread(target=self._one, args=(number,), daemon=True)
            thread.start()
            self.threads.append(thread)
            self.stopped.wait(self.interval_s)

    def __enter__(self):
        self.pacer.start()
        return self

    def __exit__(self, *exc):
        self.stopped.set()
        self.pacer.join()
        for thread in self.threads:
            thread.join(70)

    def figures(self) -> dict:
        failures = [what for ok, _, what in self.results if not ok]
        return {"sent": len(self.results), "failed": len(failures),
                "longest_s": round(max((s for _, s, _ in self.results), default=0), 2),
                "first_failures": failures[:3]}


def gateway_retries(gateway) -> int:
    """Requests that failed at a worker and that the gateway sent again to another (smg_worker_retries_total),
    read on the gateway host: smg's metrics port listens on its loopback only."""
    text = fleet.ssh(gateway, f"curl -sf -m 10 127.0.0.1:{PROMETHEUS_PORT}/metrics")
    return int(sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith("smg_worker_retries_total")))


def starts_since(host, since: float) -> int:
    """How many times the SGLang server started on `host` since `since` (epoch seconds), from its journal."""
    journal = fleet.ssh(host, f"journalctl -u {SGLANG_UNIT} --since @{int(since)} -o cat --no-pager")
    return journal.count(BANNER)


def changed_operations(output: str) -> set[str]:
    """The operations that changed a host in any of the rollout's pyinfra runs."""
    tables = [results_table(f"--> Results:{part}") for part in output.split("--> Results:")[1:]]
    return {op for table in tables for op, row in table.items() if row[1] != "-"}


def rolled(tmp_path, fleet_behind_gateway, value: str, *args: str) -> tuple[subprocess.CompletedProcess, dict, float]:
    """A rollout of a new restart input under load: (the rollout, the load's figures, its seconds)."""
    gateway, workers = fleet_behind_gateway
    retries = gateway_retries(gateway)
    with Load(f"http://{gateway.address}:{GATEWAY_PORT}/v1/chat/completions") as load:
        time.sleep(2)  # steady load before the first drain
        run, seconds = rollout(restart_input(tmp_path, value), *args)
        time.sleep(2)
    return run, {**load.figures(), "retried_by_gateway": gateway_retries(gateway) - retries}, seconds


def test_a_rolling_change_under_load_fails_no_request(fleet_behind_gateway, tmp_path):
    gateway, workers = fleet_behind_gateway
    pids = {w.name: main_pid(w) for w in workers}
    since = time.time()
    run, figures, seconds = rolled(tmp_path, fleet_behind_gateway, "drained")
    print(f"rolling change with drain: {figures}, rollout {seconds:.0f} s")
    assert run.returncode == 0, run.output[-4000:]
    assert figures["failed"] == 0 and figures["sent"] > 100, figures
    assert figures["retried_by_gateway"] == 0, figures  # no request even reached a stopping server
    assert all(main_pid(w) != pids[w.name] for w in workers)
    assert {w.name: starts_since(w, since) for w in workers} == {w.name: 1 for w in workers}
    assert gateway_workers(gateway) == {f"http://{w.address}:30000": "ready" for w in workers}
    assert run.output.count("rollout: batch") == 2 * (len(workers) + 1)  # one run per worker, then the gateway's
    assert {f"Drain {SGLANG_UNIT} from the gateway", f"SGLang service {SGLANG_UNIT}",
            f"{SGLANG_UNIT} back in the gateway"} <= changed_operations(run.output)


def test_a_second_rollout_changes_nothing_and_writes_nothing_to_the_gateway(fleet_behind_gateway, tmp_path):
    gateway, workers = fleet_behind_gateway
    pids, writes = {w.name: main_pid(w) for w in workers}, admin_writes(gateway)
    run, seconds = rollout(restart_input(tmp_path, "drained"), "--batch", str(len(workers)))
    assert run.returncode == 0, run.output[-3000:]
    assert run.output.count("--> Results:") == 2  # the workers' batch, the gateway's
    assert changed_operations(run.output) == set()
    assert admin_writes(gateway) == writes
    assert {w.name: main_pid(w) for w in workers} == pids


def test_a_worker_failing_readiness_is_rolled_back_kept_out_and_stops_the_rollout(fleet_behind_gateway, tmp_path):
    gateway, workers = fleet_behind_gateway
    victim, others = workers[0], workers[1:]
    untouched = {w.name: (main_pid(w), fleet.ssh(w, f"cat {ENV_FILE}")) for w in others}
    previous_env = fleet.ssh(victim, f"cat {ENV_FILE}")
    fleet.ssh(victim, f"echo '{{\"health_fail\": true}}' > {FAULT_KNOBS}")  # the new unit's server never gets healthy
    try:
        run, seconds = rollout(restart_input(tmp_path, "failing", FAULT_KNOBS), "--data", "ready_timeout_s=15")
    finally:
        fleet.ssh(victim, f"rm -f {FAULT_KNOBS}")
    out = run.output
    print(f"worker failing readiness: rollout stopped after {seconds:.0f} s")
    assert run.returncode != 0
    assert "restored the previous unit, which generates again" in out, out[-3000:]
    assert f"batch 1/{len(workers) + 1} failed" in out and f"Not touched: {', '.join(w.name for w in others)}" in out
    assert fleet.ssh(victim, f"cat {ENV_FILE}") == previous_env  # the previous unit, restored
    assert gateway_workers(gateway) == {f"http://{w.address}:30000": "ready" for w in others}  # victim not back
    assert {w.name: (main_pid(w), fleet.ssh(w, f"cat {ENV_FILE}")) for w in others} == untouched
    ask = {"model": "kimi-k2.6", "messages": [{"role": "user", "content": "still serving?"}], "max_tokens": 8}
    assert call(f"http://{gateway.address}:{GATEWAY_PORT}/v1/chat/completions", key=KEY, body=ask)[0] == 200
    # The gateway's own run keeps the rolled-back worker out (it serves its previous unit, not the inventory's)...
    alone = run_deploy(*SPREAD, "--limit", gateway.name)
    assert alone.returncode == 0, alone.output[-3000:]
    assert gateway_workers(gateway) == {f"http://{w.address}:30000": "ready" for w in others}
    # ...until a run deploys it healthy: the change it failed, now without the fault, brings it back.
    healed = run_deploy(*SPREAD, "--limit", victim.name, group_data=restart_input(tmp_path, "failing", FAULT_KNOBS))
    assert healed.returncode == 0, healed.output[-3000:]
    assert f"{SGLANG_UNIT} back in the gateway" in changed_operations(healed.output)
    assert gateway_workers(gateway) == {f"http://{w.address}:30000": "ready" for w in workers}
    # The others are as the failing rollout left them; the victim's unit names the fault's knobs file.


def generates(host, timeout_s: float = 60) -> bool:
    """The host's server answers /health_generate within `timeout_s` (asked on the host itself)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if fleet.ssh(host, "curl -sf -m 5 -o /dev/null -w '%{http_code}' localhost:30000/health_generate",
                     check=False).strip() == "200":
            return True
        time.sleep(1)
    return False


def test_the_same_restarts_without_the_drain_fail_requests(fleet_behind_gateway):
    """Last: the failures it provokes leave the gateway's circuit breakers open for a while."""
    gateway, workers = fleet_behind_gateway
    assert gateway_workers(gateway) == {f"http://{w.address}:30000": "ready" for w in workers}  # as the drained run
    # Every new server loads for SLOW_START_S, the healed victim's too (its unit names the fault's knobs
    # file): the gateway may send all of a steady load to one worker, which must not be back at once.
    for worker in workers:
        fleet.ssh(worker, f"cp {SLOW_START} {FAULT_KNOBS}")
    retries, started = gateway_retries(gateway), time.monotonic()
    try:
        with Load(f"http://{gateway.address}:{GATEWAY_PORT}/v1/chat/completions") as load:
            time.sleep(2)  # steady load before the first restart
            for worker in workers:  # one at a time, as the rollout's batches: the unit restarted, not drained
                fleet.ssh(worker, f"systemctl restart {SGLANG_UNIT}")
                assert generates(worker), f"{worker.name} does not generate after its restart"
            time.sleep(2)
    finally:
        for worker in workers:
            fleet.ssh(worker, f"rm -f {FAULT_KNOBS}")
    figures = {**load.figures(), "retried_by_gateway": gateway_retries(gateway) - retries}
    print(f"restarts without drain: {figures}, {time.monotonic() - started:.0f} s")
    assert figures["failed"] + figures["retried_by_gateway"] > 0, figures
