"""A gateway host in front of the lab's workers: the real smg, workers registered through its API,
Debian's Prometheus scraping them; the deployed-host checks of the gateway catch the faults made here.

The lab's fleet gets `gateway=1` (lab-gateway-1, GPU-less) for this module; the workers are
deployed listening on the lab network with an API key, as a gateway needs. Afterwards the
gateway host is stopped and the workers are deployed back to the shared lab's state.
"""

import json
import os
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

from lab import fleet
from operations.server.host_scripts.engine_answers import NO_THINKING
from tests.deployed.faults import assert_caught, run_suite
from tests.faults.faultlab import set_knobs, wait_for
from tests.helpers import (LAB_INVENTORY, PYINFRA, REPO, SGLANG_UNIT, behind_gateway, changed_operations, main_pid,
                           run_deploy, write_group_data)

pytestmark = pytest.mark.lab

KEY = "lab-gateway-test-key"  # the clients' (and the workers')
ADMIN_KEY = "lab-gateway-test-admin-key"  # the gateway's control plane's
EXPOSED = ("--data", "bind_address=0.0.0.0", "--data", "gateway_bind_address=0.0.0.0")
GATEWAY_PORT = 30080  # group_data/gateway.py
ANSI = re.compile(r"\x1b\[[0-9;]*m")


@pytest.fixture(scope="module")
def gateway_lab(lab_hosts):
    """The lab with a gateway host; the first deploy's output and how long it took."""
    with behind_gateway(*EXPOSED, key=KEY, admin_key=ADMIN_KEY) as (hosts, first, seconds):
        yield hosts, first, seconds


def gateway_host(hosts):
    return next(h for h in hosts if h.host_class == "gateway")


def worker_hosts(hosts):
    return [h for h in hosts if h.host_class != "gateway"]


# Lab addresses directly, never through this machine's outbound proxy.
DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def call(url: str, key: str | None = None, body: dict | None = None) -> tuple[int, dict]:
    request = urllib.request.Request(url, data=None if body is None else json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json",
                                              **({"Authorization": f"Bearer {key}"} if key else {})})
    try:
        with DIRECT.open(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        body = error.read() or b"{}"
        try:
            return error.code, json.loads(body)
        except ValueError:  # smg answers a refused key in plain text
            return error.code, {"error": body.decode(errors="replace")}


def gateway_workers(gateway) -> dict[str, str]:
    _, listing = call(f"http://{gateway.address}:{GATEWAY_PORT}/workers", key=ADMIN_KEY)
    return {w["url"]: w["status"] for w in listing["workers"]}


def admin_writes(gateway) -> int:
    """POST/DELETE /workers the gateway answered, from its own request log (journal)."""
    journal = ANSI.sub("", fleet.ssh(gateway, "journalctl -u smg -o cat --no-pager"))
    return len(re.findall(r"method=(?:POST|DELETE) path=/workers\S* .*status_code=", journal))


def test_every_worker_is_registered_and_a_request_through_the_gateway_answers(gateway_lab):
    hosts, first, seconds = gateway_lab
    assert first.returncode == 0, first.output[-4000:]
    gateway, workers = gateway_host(hosts), worker_hosts(hosts)
    registration = re.search(r"\[lab-gateway-1\] gateway .*: registered .*\((\d+\.\d) s\)", first.output)
    print(f"deploy with a gateway: {seconds:.0f} s; registration: {registration and registration.group(1)} s")
    assert registration, first.output[-3000:]
    _, readiness = call(f"http://{gateway.address}:{GATEWAY_PORT}/readiness")
    assert readiness == {"status": "ready", "healthy_workers": len(workers), "total_workers": len(workers)}
    assert gateway_workers(gateway) == {f"http://{w.address}:30000": "ready" for w in workers}

    ask = {"model": "kimi-k2.6", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 8,
           **NO_THINKING}  # Kimi thinks by default: a plain answer is asked for
    status, answer = call(f"http://{gateway.address}:{GATEWAY_PORT}/v1/chat/completions", key=KEY, body=ask)
    assert status == 200 and answer["choices"][0]["message"]["content"], answer
    assert call(f"http://{gateway.address}:{GATEWAY_PORT}/v1/chat/completions", body=ask)[0] == 401
    # The keys are in the gateway's key files only: not in any process's argv, not in its journal.
    seen = fleet.ssh(gateway, "ps -eo args; journalctl -u smg -o cat --no-pager")
    assert KEY not in seen and ADMIN_KEY not in seen
    # The control plane takes the admin key alone: a client cannot register a worker of its own.
    rogue = {"url": "http://192.0.2.1:30000"}
    assert call(f"http://{gateway.address}:{GATEWAY_PORT}/workers", key=KEY, body=rogue)[0] == 401
    assert call(f"http://{gateway.address}:{GATEWAY_PORT}/workers", body=rogue)[0] == 401
    assert call(f"http://{gateway.address}:{GATEWAY_PORT}/v1/chat/completions", key=ADMIN_KEY, body=ask)[0] == 401
    assert "http://192.0.2.1:30000" not in gateway_workers(gateway)
    # A worker's admin-optional routes take its host's own admin key: the clients' key gets 401 there.
    for worker in workers:
        for path in ("/update_weights_from_disk", "/set_internal_state"):
            # From the gateway's host: the worker's unit admits its gateways and loopback alone.
            refused = fleet.ssh(gateway, f"curl -s -o /dev/null -w '%{{http_code}}' -m 10 -X POST -d '{{}}' "
                                         f"-H 'Authorization: Bearer {KEY}' http://{worker.address}:30000{path}")
            assert refused == "401", (path, refused)
        with_admin = fleet.ssh(worker, "curl -s -o /dev/null -w '%{http_code}' -m 10 -X POST -d '{}' "
                                       "-H \"Authorization: Bearer $(cat /etc/specfleet/admin-api-key)\" "
                                       "localhost:30000/set_internal_state")
        assert with_admin == "200", with_admin
        admin = fleet.ssh(worker, "cat /etc/specfleet/admin-api-key")
        seen = fleet.ssh(worker, f"ps -eo args; journalctl -u 'sglang*' -o cat --no-pager; cat /etc/specfleet/*.env "
                                 "/etc/systemd/system/sglang*.service")
        assert len(admin) == 64 and admin not in seen and admin != KEY
    # The admin key never leaves the gateway's host: its host drains and registers the workers.
    for worker in workers:
        holding = fleet.ssh(worker, f"grep -rlsF {ADMIN_KEY} /etc /opt /srv /var /root /home /tmp /run", check=False)
        assert holding.split() == [], f"{worker.name}: {holding}"

    checks = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                             "tests/deployed/test_gateway.py", "--inventory", LAB_INVENTORY],
                            cwd=REPO, capture_output=True, text=True, timeout=300)
    assert checks.returncode == 0 and f"{len(GATEWAY_CHECKS)} passed" in checks.stdout, checks.stdout[-3000:]


def connects(source, address: str, port: int) -> bool:
    return open_ports(source, address, [port]) == [port]


def open_ports(source, address: str, ports: list[int]) -> list[int]:
    """The ports of `ports` on `address` that `source` opens a TCP connection to within 3 s (tried at once: a
    port whose packets an IP access list drops times out rather than refusing)."""
    tries = " ".join(f"(timeout 3 bash -c '</dev/tcp/{address}/{port}' 2>/dev/null && echo {port}) &" for port in ports)
    return sorted(int(port) for port in fleet.ssh(source, f"{tries} wait", check=False).split())


def unit_listening_ports(host, unit: str) -> list[int]:
    """The TCP ports every process of `unit` (ps's unit: its cgroup, in any hierarchy) listens on, whatever
    the address."""
    processes, _, sockets = fleet.ssh(host, "ps -e -o pid=,unit=; echo --; ss -Hltnp").partition("--\n")
    unit_pids = {pid for pid, _, name in (line.strip().partition(" ") for line in processes.splitlines())
                 if name.strip() == f"{unit}.service"}
    return sorted({int(line.split()[3].rsplit(":", 1)[1]) for line in sockets.splitlines()
                   if unit_pids & set(re.findall(r"pid=(\d+)", line))})


def test_each_workers_unit_admits_loopback_and_its_gateway_alone_so_its_store_is_closed_to_the_network(gateway_lab):
    """torch's TCPStore (nccl_port 31000) listens on every address whatever bind_address says: the replica's
    unit admits packets from loopback and the run's gateway alone, and may not bind the fan-out's port. The
    lab's hosts enforce the list (lab/fleet.py boots them as a Debian host's systemd does it: cgroup v2, bpf()
    allowed), so from another worker's host, which no list names, every port the unit listens on (the API on
    0.0.0.0 here, the store on every address) is closed, while the host itself reaches its store."""
    hosts, _, _ = gateway_lab
    gateway, workers = gateway_host(hosts), worker_hosts(hosts)
    for worker, other in zip(workers, workers[1:] + workers[:1]):
        shown = {name: set(value.split()) for name, value in (line.split("=", 1) for line in fleet.ssh(
            worker, f"systemctl show -p IPAddressDeny -p IPAddressAllow -p SocketBindDeny {SGLANG_UNIT}").splitlines())}
        assert shown == {"IPAddressDeny": {"0.0.0.0/0", "::/0"}, "SocketBindDeny": {"tcp30900"},
                         "IPAddressAllow": {"::1/128", "127.0.0.0/8", f"{gateway.address}/32"}}, shown
        ports = unit_listening_ports(worker, SGLANG_UNIT)
        assert {30000, 31000} <= set(ports), ports
        assert connects(worker, "127.0.0.1", 31000)  # the host itself reaches its store
        assert connects(gateway, worker.address, 30000)  # and its gateway the API
        assert open_ports(other, worker.address, ports) == [], f"{other.name} reaches {worker.name}"


def test_a_second_run_changes_nothing_and_writes_nothing_to_the_gateway(gateway_lab):
    hosts, _, _ = gateway_lab
    gateway, workers = gateway_host(hosts), worker_hosts(hosts)
    pids = {w.name: main_pid(w) for w in workers}
    writes = admin_writes(gateway)
    assert writes >= len(workers)  # the first run's registrations are in the gateway's log

    again = run_deploy(*EXPOSED)
    assert again.returncode == 0, again.output[-3000:]
    assert changed_operations(again.output) == []
    assert admin_writes(gateway) == writes
    assert {w.name: main_pid(w) for w in workers} == pids


def test_smgs_metrics_port_takes_no_key_so_only_its_own_host_reaches_it(gateway_lab):
    hosts, _, _ = gateway_lab
    gateway, worker = gateway_host(hosts), worker_hosts(hosts)[0]
    # The gateway listens on the lab network (gateway_bind_address=0.0.0.0); its metrics do not.
    assert fleet.ssh(worker, f"curl -s -o /dev/null -w '%{{http_code}}' -m 5 http://{gateway.address}:{GATEWAY_PORT}/readiness",
                     check=False) == "200"
    assert fleet.ssh(worker, f"curl -s -o /dev/null -w '%{{http_code}}' -m 5 http://{gateway.address}:29000/metrics",
                     check=False) == "000"  # refused
    listening = fleet.ssh(gateway, "ss -Hltn 'sport = :29000' | awk '{print $4}'").split()
    assert listening == ["127.0.0.1:29000"], listening
    assert "smg_" in fleet.ssh(gateway, "curl -s -m 5 127.0.0.1:29000/metrics")
    assert prometheus_health(gateway).get("smg/127.0.0.1:29000") == "up"


def prometheus_health(gateway) -> dict[str, str]:
    """job/instance -> health, as Prometheus on the gateway host reports its targets."""
    answer = fleet.ssh(gateway, "curl -s -m 5 127.0.0.1:9090/api/v1/targets", check=False)
    try:
        active = json.loads(answer)["data"]["activeTargets"]
    except (ValueError, KeyError):
        return {}
    return {f"{t['labels']['job']}/{t['labels']['instance']}": t["health"] for t in active}


GATEWAY_CHECKS = {"test_gateway_unit_is_enabled_and_active", "test_gateway_readiness_counts_every_inventory_worker_healthy",
                  "test_every_inventory_worker_is_registered_and_ready", "test_a_request_through_the_gateway_answers",
                  "test_prometheus_scrapes_every_inventory_worker_and_smg_all_up",
                  "test_only_the_admin_key_registers_workers", "test_the_gateway_and_prometheus_units_are_confined",
                  "test_prometheus_listens_only_where_group_data_says"}


def test_a_stopped_gateway_is_caught(gateway_lab):
    hosts, _, _ = gateway_lab
    gateway = gateway_host(hosts)
    fleet.ssh(gateway, "systemctl stop smg")
    try:
        wait_for(lambda: prometheus_health(gateway).get("smg/127.0.0.1:29000") == "down", 60, 1,
                 "Prometheus to see smg down")
        result = run_suite(gateway.name)
    finally:
        fleet.ssh(gateway, "systemctl start smg")
        assert run_deploy(*EXPOSED).returncode == 0  # a started smg has forgotten its workers
    assert_caught(result, gateway.name, GATEWAY_CHECKS - {"test_prometheus_listens_only_where_group_data_says",
                                                          "test_the_gateway_and_prometheus_units_are_confined"},
                  rf"{gateway.name}: expected smg enabled and active",
                  rf"{gateway.name}: expected /readiness ready with {len(worker_hosts(hosts))} healthy workers, found \{{\}}",
                  rf"{gateway.name}: expected Prometheus's {len(hosts)} targets up, found smg {gateway.name} "
                  r"\(127\.0\.0\.1:29000\): down .*connection refused")


def test_a_worker_missing_from_the_gateway_is_caught(gateway_lab):
    hosts, _, _ = gateway_lab
    gateway, workers = gateway_host(hosts), worker_hosts(hosts)
    missing = f"http://{workers[0].address}:30000"
    _, listing = call(f"http://{gateway.address}:{GATEWAY_PORT}/workers", key=ADMIN_KEY)
    worker_id = next(w["id"] for w in listing["workers"] if w["url"] == missing)
    request = urllib.request.Request(f"http://{gateway.address}:{GATEWAY_PORT}/workers/{worker_id}", method="DELETE",
                                     headers={"Authorization": f"Bearer {ADMIN_KEY}"})
    DIRECT.open(request, timeout=30).close()
    try:
        wait_for(lambda: missing not in gateway_workers(gateway), 60, 1, f"the gateway to drop {missing}")
        result = run_suite(gateway.name)
    finally:
        assert run_deploy(*EXPOSED).returncode == 0  # registers it again
    # The other workers still answer through the gateway; a lab with one worker has none left.
    unanswered = {"test_a_request_through_the_gateway_answers"} if len(workers) == 1 else set()
    assert_caught(result, gateway.name, {"test_gateway_readiness_counts_every_inventory_worker_healthy",
                                         "test_every_inventory_worker_is_registered_and_ready", *unanswered},
                  rf"{gateway.name}: expected /readiness ready with {len(workers)} healthy workers, found ",
                  rf"{gateway.name}: expected the gateway's workers .*{re.escape(missing)}")


def test_a_worker_whose_metrics_fail_fails_the_gateway_host_naming_it_and_is_caught(gateway_lab):
    hosts, _, _ = gateway_lab
    gateway, worker = gateway_host(hosts), worker_hosts(hosts)[0]
    target = f"sglang/{worker.address}:30000"
    set_knobs(worker, metrics_fail=True)
    try:
        wait_for(lambda: prometheus_health(gateway).get(target) == "down", 60, 1, f"Prometheus to see {target} down")
        deploy = run_deploy(*EXPOSED, "--data", "prometheus_targets_timeout_s=5")
        result = run_suite(gateway.name)
    finally:
        set_knobs(worker)
        wait_for(lambda: set(prometheus_health(gateway).values()) == {"up"}, 60, 1, "every Prometheus target up again")
    assert deploy.returncode != 0, deploy.output[-3000:]
    assert re.search(rf"\[{gateway.name}\] Prometheus targets down after \d+ s: sglang {worker.name} "
                     rf"\({re.escape(worker.address)}:30000\): down server returned HTTP status 503", ANSI.sub("", deploy.output)), \
        deploy.output[-3000:]
    assert_caught(result, gateway.name, {"test_prometheus_scrapes_every_inventory_worker_and_smg_all_up"},
                  rf"{gateway.name}: expected Prometheus's {len(hosts)} targets up, found sglang {worker.name} "
                  rf"\({re.escape(worker.address)}:30000\): down server returned HTTP status 503")


def test_prometheus_stopped_or_listening_beyond_loopback_is_caught(gateway_lab):
    hosts, _, _ = gateway_lab
    gateway = gateway_host(hosts)
    all_up = lambda: set(prometheus_health(gateway).values()) == {"up"}  # noqa: E731
    fleet.ssh(gateway, "systemctl stop prometheus")
    try:
        stopped = run_suite(gateway.name)
    finally:
        fleet.ssh(gateway, "systemctl start prometheus")
    wait_for(all_up, 60, 1, "every Prometheus target up again")
    fleet.ssh(gateway, "cp -p /etc/default/prometheus /root/prometheus.default && "
                       "sed -i 's/127.0.0.1:9090/0.0.0.0:9090/' /etc/default/prometheus && systemctl restart prometheus")
    try:
        wait_for(all_up, 60, 1, "every Prometheus target up again")
        exposed = run_suite(gateway.name)
    finally:
        fleet.ssh(gateway, "mv /root/prometheus.default /etc/default/prometheus && systemctl restart prometheus")
        wait_for(all_up, 60, 1, "every Prometheus target up again")
    assert_caught(stopped, gateway.name, {"test_prometheus_scrapes_every_inventory_worker_and_smg_all_up",
                                          "test_prometheus_listens_only_where_group_data_says"},
                  rf"{gateway.name}: expected Prometheus's {len(hosts)} targets up, found Prometheus does not answer",
                  rf"{gateway.name}: expected Prometheus listening on 127\.0\.0\.1:9090 only, found \[\]")
    # ss writes a socket on every IPv4 and IPv6 address as *.
    assert_caught(exposed, gateway.name, {"test_prometheus_listens_only_where_group_data_says"},
                  rf"{gateway.name}: expected Prometheus listening on 127\.0\.0\.1:9090 only, found \['\*:9090'\]")


# smg's defaults but a 10 s interval: the health settings group_data/gateway.py had before it fitted them to SGLang.
SMG_DEFAULT_HEALTH = dict(endpoint="/health", interval_secs=10, timeout_secs=5, failure_threshold=3, success_threshold=2)
STALL_S = 8  # every batch of the busy worker takes this long (a long prefill chunk): its /health waits for one


def health_seconds(worker) -> float:
    """How long the worker's /health takes, asked on the worker itself."""
    return float(fleet.ssh(worker, "curl -s -o /dev/null -m 60 -w '%{time_total}' localhost:30000/health"))


def statuses(gateway, url: str, seconds: float) -> list[str]:
    """The worker's status on the gateway, every 3 s for `seconds`."""
    seen, deadline = [], time.monotonic() + seconds
    while time.monotonic() < deadline:
        seen.append(gateway_workers(gateway).get(url, "absent"))
        time.sleep(3)
    return seen


def test_a_busy_worker_stays_in_with_health_checks_fitted_to_sglang_and_drops_out_with_smgs_defaults(
        gateway_lab, tmp_path):
    hosts, _, _ = gateway_lab
    gateway, busy = gateway_host(hosts), worker_hosts(hosts)[0]
    url = f"http://{busy.address}:30000"
    old = write_group_data(tmp_path, "gateway", f"gateway_health = {SMG_DEFAULT_HEALTH!r}")
    try:
        assert run_deploy(*EXPOSED, "--limit", gateway.name, group_data=old).returncode == 0
        set_knobs(busy, batch_stall_s=STALL_S)
        took = health_seconds(busy)
        started = time.monotonic()
        wait_for(lambda: gateway_workers(gateway).get(url) == "not_ready", 120, 2,
                 "smg's default health settings to take the busy worker out")
        dropped_s = time.monotonic() - started
        fitted = run_deploy(*EXPOSED, "--limit", gateway.name)  # group_data's own settings, the worker still busy
        assert fitted.returncode == 0, fitted.output[-3000:]
        # Longer than three failures would take: a probe every 10 s, each given 25 s.
        seen = statuses(gateway, url, 100)
    finally:
        set_knobs(busy)
    print(f"busy worker (/health {took:.1f} s): smg's defaults took it out after {dropped_s:.0f} s; "
          f"the fitted settings kept it {seen.count('ready')} of {len(seen)} samples ready over 100 s")
    assert took > SMG_DEFAULT_HEALTH["timeout_secs"]
    assert set(seen) == {"ready"}, seen
    wait_for(lambda: gateway_workers(gateway) == {f"http://{w.address}:30000": "ready" for w in worker_hosts(hosts)},
             60, 2, "every worker ready")


def test_a_worker_removed_from_the_inventory_is_removed_from_the_gateway(gateway_lab, tmp_path):
    hosts, _, _ = gateway_lab
    gateway, workers = gateway_host(hosts), worker_hosts(hosts)
    removed, kept = workers[0], workers[1:]
    inventory = tmp_path / "without_one_worker.py"
    # The lab inventory's groups without that worker (underscored names are not groups to pyinfra).
    inventory.write_text(
        "import lab.inventory as _lab\n"
        "for _group, _hosts in list(vars(_lab).items()):\n"
        "    if isinstance(_hosts, list) and not _group.startswith('_'):\n"
        f"        globals()[_group] = [_h for _h in _hosts if (_h[0] if isinstance(_h, tuple) else _h) != {removed.name!r}]\n")
    try:
        run = subprocess.run([str(PYINFRA), "-y", "--group-data", str(REPO / "lab" / "group_data"), str(inventory),
                              "deploy.py", *EXPOSED], cwd=REPO, capture_output=True, text=True, timeout=600,
                             env={**os.environ, "HF_TOKEN": "hf_lab_granted", "PYTHONPATH": str(REPO)})
        output = run.stdout + run.stderr
        listed = gateway_workers(gateway)
    finally:
        # The module's later tests take workers[0] as a registered worker: the full inventory registers it again.
        assert run_deploy(*EXPOSED).returncode == 0
    assert run.returncode == 0, output[-3000:]
    assert f"removed ['http://{removed.address}:30000']" in output, output[-3000:]
    assert listed == {f"http://{w.address}:30000": "ready" for w in kept}
    assert gateway_workers(gateway) == {f"http://{w.address}:30000": "ready" for w in workers}



def test_a_worker_down_longer_than_smgs_failure_window_is_back_by_itself_and_the_next_deploy_converges(gateway_lab):
    """smg 1.13.0 with group_data/gateway.py's health settings: a replica stopped until the gateway lists it
    `failed` is `ready` again within 5 minutes of starting, with no deploy; the next plain deploy converges
    (its sync also removes and registers again a worker still `failed`, as newer smg keeps one)."""
    hosts, _, _ = gateway_lab
    gateway, worker = gateway_host(hosts), worker_hosts(hosts)[0]
    url = f"http://{worker.address}:30000"
    assert gateway_workers(gateway).get(url) == "ready", gateway_workers(gateway)  # else it never reads failed
    fleet.ssh(worker, f"systemctl stop {SGLANG_UNIT}")
    stopped = time.monotonic()
    try:
        wait_for(lambda: gateway_workers(gateway).get(url) == "failed", 300, 2, f"the gateway to list {url} failed")
        failed_s = time.monotonic() - stopped
    finally:
        fleet.ssh(worker, f"systemctl start {SGLANG_UNIT}")
    started = time.monotonic()
    wait_for(lambda: gateway_workers(gateway).get(url) == "ready", 300, 2, f"{url} ready again without a deploy")
    print(f"a stopped worker read failed after {failed_s:.0f} s; ready {time.monotonic() - started:.0f} s after its start")
    again = run_deploy(*EXPOSED)
    assert again.returncode == 0, again.output[-3000:]
    assert gateway_workers(gateway) == {f"http://{w.address}:30000": "ready" for w in worker_hosts(hosts)}
