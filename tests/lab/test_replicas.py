"""Serving a model the way its size asks: Qwen3.6-27B + DDTree on the PCIe class is eight TP 1 replicas,
each a unit on one GPU and its own port, each a worker of the real smg on lab-gateway-1, a request
through the gateway reaching each of them; a second run changes nothing; the deployed-host checks
verify every replica.

The lab's fleet gets `gateway=1` for this module; the workers listen on the lab network with an API
key, as a gateway needs. Afterwards the gateway host is stopped and the workers are deployed back to
the shared lab's state (group_data's profile, loopback, no key).
"""

import json
import os
import re
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import pytest

from lab import fleet
from lab.config import TOKEN_GRANTED
from serving_benchmark import gateways
from tests.helpers import REPO, behind_gateway, changed_operations, main_pid, operations_started, run_deploy, serving
from tests.lab.test_rollout import Load, gateway_retries
from tests.lab.test_serving_benchmark import run_bench

pytestmark = pytest.mark.lab

KEY = "lab-replicas-test-key"
ADMIN_KEY = "lab-replicas-test-admin-key"  # the gateway's control plane's
QWEN = serving("qwen36_ddtree")
# round_robin: each new request to the next worker, so a request per worker reaches every one; the
# default cache_aware keeps prompts of a shared prefix (a chat template's) on the worker that cached it.
EXPOSED = ("--data", "bind_address=0.0.0.0", "--data", "gateway_bind_address=0.0.0.0",
           "--data", "gateway_policy=round_robin")
GATEWAY_PORT = 30080  # group_data/gateway.py
PORTS = range(30000, 30008)  # group_data/all.py port + each replica's GPU index
DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # lab addresses, never through a proxy


@pytest.fixture(scope="module")
def replicas_lab(lab_hosts):
    """The lab with a gateway, every worker serving Qwen3.6-27B + DDTree: (hosts, first deploy, seconds)."""
    with behind_gateway(*EXPOSED, key=KEY, admin_key=ADMIN_KEY, group_data=QWEN) as (hosts, first, seconds):
        yield hosts, first, seconds


def call(url: str, key: str | None = None, body: dict | None = None) -> tuple[int, dict]:
    request = urllib.request.Request(url, data=None if body is None else json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json",
                                              **({"Authorization": f"Bearer {key}"} if key else {})})
    try:
        with DIRECT.open(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read() or b"{}")


def gateway_workers(gateway) -> dict[str, str]:
    _, listing = call(f"http://{gateway.address}:{GATEWAY_PORT}/workers", key=ADMIN_KEY)
    return {w["url"]: w["status"] for w in listing["workers"]}


def generated_tokens(host) -> dict[int, float]:
    """Per replica port of `host`, the tokens its server generated so far (its own /metrics)."""
    found = {}
    for port in PORTS:
        found[port] = gateways.generated_tokens(fleet.ssh(host, f"curl -s -m 5 localhost:{port}/metrics", check=False))
    return found


def test_lab_pcie_1_runs_eight_replicas_each_on_one_gpu_and_port_all_workers_of_the_gateway(replicas_lab):
    hosts, first, seconds = replicas_lab
    assert first.returncode == 0, first.output[-4000:]
    pcie = next(h for h in hosts if h.name == "lab-pcie-1")
    gateway = next(h for h in hosts if h.host_class == "gateway")
    workers = [h for h in hosts if h.host_class != "gateway"]
    print(f"deploy of {8 * len(workers)} replicas behind the gateway: {seconds:.0f} s")
    units = fleet.ssh(pcie, "systemctl list-units --no-legend --plain --state=active 'sglang*'").split("\n")
    assert sorted(line.split()[0] for line in units if line.strip()) == \
        [f"sglang@qwen36_ddtree-gpu{i}.service" for i in range(8)]
    for i, port in enumerate(PORTS):
        info = json.loads(fleet.ssh(pcie, f"curl -sf -m 10 -H 'Authorization: Bearer {KEY}' localhost:{port}/server_info"))
        assert (info["port"], info["tp_size"], info["speculative_algorithm"]) == (port, 1, "DDTREE")
        environ = fleet.ssh(pcie, f"tr '\\0' '\\n' < /proc/{main_pid(pcie, f'sglang@qwen36_ddtree-gpu{i}').split()[0]}/environ")
        assert f"CUDA_VISIBLE_DEVICES={i}" in environ.split("\n"), environ
    # nvidia-smi: one scheduler process on each GPU, eight in all.
    apps = fleet.ssh(pcie, "nvidia-smi --query-compute-apps=pid,gpu_bus_id --format=csv,noheader").split("\n")
    buses = fleet.ssh(pcie, "nvidia-smi --query-gpu=pci.bus_id --format=csv,noheader").split()
    assert sorted(line.split(", ")[1] for line in apps if line.strip()) == sorted(buses)
    # Every replica of every worker host is a worker of the gateway, ready.
    assert gateway_workers(gateway) == {f"http://{w.address}:{port}": "ready" for w in workers for port in PORTS}


def test_a_request_through_the_gateway_reaches_each_replica(replicas_lab):
    hosts, _, _ = replicas_lab
    pcie = next(h for h in hosts if h.name == "lab-pcie-1")
    gateway = next(h for h in hosts if h.host_class == "gateway")
    workers = len(gateway_workers(gateway))
    before = generated_tokens(pcie)
    for sent in range(workers):  # one request per worker of the gateway, round robin
        ask = {"model": "qwen3.6-27b", "max_tokens": 4, "messages": [{"role": "user", "content": f"request {sent}"}]}
        status, answer = call(f"http://{gateway.address}:{GATEWAY_PORT}/v1/chat/completions", key=KEY, body=ask)
        assert status == 200 and answer["choices"][0]["message"]["content"], answer
    reached = {port: now - before[port] for port, now in generated_tokens(pcie).items()}
    print(f"{workers} requests through the gateway; tokens generated per lab-pcie-1 replica: {reached}")
    assert reached == {port: 4.0 for port in PORTS}, reached  # each replica answered one request


def test_the_deployed_host_checks_pass_on_every_replica(replicas_lab):
    """tests/deployed with the lab's inventory, every host serving the same profile as the deploy's --data."""
    hosts, _, _ = replicas_lab
    profiles = ",".join(f"{h.name}=qwen36_ddtree" for h in hosts)
    checks = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/deployed",
                             "--inventory", "lab/inventory.py", "--limit", "lab-pcie-1",
                             "-k", "unit or serving or sglang"],
                            cwd=REPO, capture_output=True, text=True, timeout=600,
                            env={**os.environ, "HF_TOKEN": TOKEN_GRANTED, "SPECFLEET_LAB_PROFILES": profiles,
                                 "SPECFLEET_API_KEY": KEY})
    assert checks.returncode == 0, checks.stdout[-4000:]
    passed = int(re.search(r"(\d+) passed", checks.stdout).group(1))
    assert passed >= 15 and " failed" not in checks.stdout, checks.stdout[-3000:]


def test_a_second_run_changes_nothing(replicas_lab):
    hosts, _, _ = replicas_lab
    workers = [h for h in hosts if h.host_class != "gateway"]
    pids = {(w.name, i): main_pid(w, f"sglang@qwen36_ddtree-gpu{i}") for w in workers for i in range(8)}
    again = run_deploy(*EXPOSED, group_data=QWEN)
    assert again.returncode == 0, again.output[-3000:]
    assert changed_operations(again.output) == []
    assert {(w.name, i): main_pid(w, f"sglang@qwen36_ddtree-gpu{i}") for w in workers for i in range(8)} == pids


def test_a_change_rolls_the_hosts_replicas_one_at_a_time_and_it_keeps_serving(replicas_lab):
    """A restart input of every replica (the stop timeout in its unit): each replica drains, restarts and
    comes back in turn, so at most one of the host's eight units is down at any moment, and the requests
    through the gateway meanwhile are answered, none failed or resent."""
    hosts, _, _ = replicas_lab
    pcie = next(h for h in hosts if h.name == "lab-pcie-1")
    gateway = next(h for h in hosts if h.host_class == "gateway")
    units = [f"sglang@qwen36_ddtree-gpu{i}" for i in range(8)]
    pids = {unit: main_pid(pcie, unit) for unit in units}
    retries, down, rolled = gateway_retries(gateway), [], threading.Event()

    def watch():  # how many of the host's units are not active, twice a second
        while not rolled.is_set():
            states = fleet.ssh(pcie, f"systemctl is-active {' '.join(units)}", check=False).split()
            down.append(sum(state != "active" for state in states))
            rolled.wait(0.5)

    watcher = threading.Thread(target=watch, daemon=True)
    with Load(f"http://{gateway.address}:{GATEWAY_PORT}/v1/chat/completions", model="qwen3.6-27b", key=KEY) as load:
        watcher.start()
        time.sleep(2)  # steady load before the first drain
        changed = run_deploy(*EXPOSED, "--data", "longest_generation_s=901", "--limit", pcie.name, group_data=QWEN)
        rolled.set()
        watcher.join(30)
    assert changed.returncode == 0, changed.output[-3000:]
    started = [op for op in operations_started(changed.output) if "qwen36_ddtree-gpu" in op]
    assert started == [step for unit in units for step in (  # each replica through all its steps, in turn
        f"Drain {unit} from the gateway", f"SGLang service {unit}", f"SGLang generates {unit}",
        f"KV plan of {unit}", f"{unit} back in the gateway")], started
    assert all(main_pid(pcie, unit) != pids[unit] for unit in units)
    figures = load.figures()
    print(f"rolling 8 replicas of lab-pcie-1: {figures}, at most {max(down)} unit(s) down at a time")
    assert figures["sent"] > 0 and figures["failed"] == 0, figures
    assert gateway_retries(gateway) == retries  # none of them needed resending to another worker
    assert max(down) <= 1, down


def test_the_bench_runs_through_a_gateway_in_front_of_the_host_alone_over_all_its_replicas(replicas_lab, tmp_path):
    """The gateway in front of lab-pcie-1 alone (an inventory in which lab-b200-1 serves another model: the
    gateway's stage removes its workers): after the sweep, each level runs through the gateway with the
    API key, spread over the eight replicas by its policy, and the key is in no result. Last in the
    module: the fixture deploys the shared lab's state back."""
    hosts, _, _ = replicas_lab
    pcie = next(h for h in hosts if h.name == "lab-pcie-1")
    gateway = next(h for h in hosts if h.host_class == "gateway")
    with pytest.MonkeyPatch.context() as env:  # host data (--data would give every host one profile)
        env.setenv("SPECFLEET_LAB_PROFILES", f"{pcie.name}=qwen36_ddtree,{gateway.name}=qwen36_ddtree,"
                                             "lab-b200-1=kimi_k26_dflash")
        narrowed = run_deploy(*EXPOSED, "--limit", pcie.name, "--limit", gateway.name)
        assert narrowed.returncode == 0, narrowed.output[-3000:]
        assert set(gateway_workers(gateway)) == {f"http://{pcie.address}:{port}" for port in PORTS}
        # each_replica=false: the host's pass over all eight at once, then the gateway's (test_bench_replicas.py
        # runs each replica alone).
        bench = run_bench(pcie, "modes=ar", "concurrency=8", "requests=16", "output_tokens=16", "each_replica=false",
                          f"results_dir={tmp_path}", *EXPOSED[1::2])
    assert bench.returncode == 0, bench.output[-4000:]
    (summary_file,) = tmp_path.glob(f"*/{pcie.name}/summary.json")
    summary = json.loads(summary_file.read_text())
    # Only the pass over all eight at once, and the gateway's.
    assert "replicas" not in summary and summary["modes"]["ar"]["levels"]["8"]["requests_completed"] == 16
    assert sorted(p.name for p in (summary_file.parent / "raw").iterdir()) == ["all", f"gateway-{gateway.name}"]
    through = summary["gateways"][gateway.name]
    assert through["url"] == f"http://{gateway.address}:{GATEWAY_PORT}" and through["mode"] == "ddtree"
    level = through["levels"]["8"]
    assert level["requests_completed"] == 16 and level["request_errors"] == 0 and level["accept_length"] > 1
    spread = through["generated_tokens"]
    print(f"through the gateway: {level['output_tok_s']:.0f} output tok/s; tokens per replica: {spread}")
    assert sorted(spread) == [f"sglang@qwen36_ddtree-gpu{i}" for i in range(8)] and all(n > 0 for n in spread.values())
    raw = summary_file.parent / "raw" / f"gateway-{gateway.name}" / "ddtree" / "c8"
    assert (raw / "profile_export_aiperf.json").is_file()
    everything = [bench.output, *(f.read_text(errors="replace") for f in tmp_path.rglob("*") if f.is_file())]
    assert not any(KEY in text for text in everything)
    # ...though each replica's /server_info holds it, as SGLang 0.5.23's does (api_key, the launch command).
    info = json.loads(fleet.ssh(pcie, f"curl -sf -m 10 -H 'Authorization: Bearer {KEY}' localhost:{PORTS[0]}/server_info"))
    assert info["api_key"] == KEY and f"--api-key={KEY}" in info["launch_command"]
    assert '"api_key": "***"' in (raw / "server_info.json").read_text()
    assert gateway_workers(gateway) == {f"http://{pcie.address}:{port}": "ready" for port in PORTS}
