"""bench.py end to end on one lab host: two modes, two levels, a few requests against the
stand-in engine (its speed model makes the numbers: modelled, not measured)."""

import base64
import json
import os
import re
import shlex
import signal
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest

from lab import fleet
from tests.faults.faultlab import TARGET_DIR, wait_for
from deployment.hosts import resolve
from tests.helpers import LAB_INVENTORY, PYINFRA, REPO, SGLANG_UNIT, changed_operations, run_deploy, server_info
from tests.unit.group_data import host_data

pytestmark = pytest.mark.lab


def run_bench(host, *data: str, inventory: str = LAB_INVENTORY, group_data: Path | None = None) -> subprocess.CompletedProcess:
    extra = ["--group-data", str(group_data)] if group_data else []
    command = [str(PYINFRA), "-y", *extra, inventory, "bench.py", "--limit", host.name,
               *(arg for item in data for arg in ("--data", item))]
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=900)
    result.output = result.stdout + result.stderr
    return result


def test_bench_refuses_a_bad_knob_or_a_retired_one_in_one_line(deployed_lab, pcie_host):
    refused = run_bench(pcie_host, "modes=nope")
    assert refused.returncode != 0 and "modes='nope' is not accepted" in refused.output, refused.output[-2000:]
    retired = run_bench(pcie_host, "input_tokens=32")
    assert retired.returncode != 0 and "input_tokens=32 is not accepted: the prompts' own lengths count" \
        in retired.output, retired.output[-2000:]
    for output in (refused.output, retired.output):
        assert "Traceback" not in output and "Starting operation: Benchmark client" not in output


def test_bench_sweeps_modes_brings_results_back_restores_the_deployment_and_gates(deployed_lab, pcie_host,
                                                                                 tmp_path):
    # The same class and profile with a far higher throughput at one level: the gate must fail.
    baseline = tmp_path / "baseline.json"
    baseline.write_text(json.dumps({"host_class": "rtx_pro_6000_pcie", "profile": "kimi_k26_dflash", "modes": {
        "dflash": {"levels": {"4": {"output_tok_s": 1e6, "accept_length": 3.45}}}}}))
    results = tmp_path / "results"
    # The shipped prompts: chat, code, reasoning, long contexts.
    bench = run_bench(pcie_host, "modes=ar,dflash", "concurrency=1,4", "requests=6", "output_tokens=32",
                      f"results_dir={results}", f"baseline={baseline}")

    assert bench.returncode != 0, bench.output[-3000:]
    assert "regression gate: worse than" in bench.output
    assert "| dflash | 4 | output tok/s | 1,000,000.00 |" in bench.output
    assert "bench dflash: concurrency 4, 6 requests" in bench.output  # progress per mode and level

    (run,) = results.iterdir()
    out = run / pcie_host.name
    summary = json.loads((out / "summary.json").read_text())
    assert summary["stand_in"] and "not a measurement" in summary["note"]
    assert (summary["host"], summary["host_class"], summary["profile"]) == (
        pcie_host.name, "rtx_pro_6000_pcie", "kimi_k26_dflash")
    assert summary["sglang_version"] == "0.5.23+lab" and summary["client"] == "aiperf==0.13.0"
    assert summary["workload"] == {"prompts": "prompts.jsonl", "prompt_count": 20, "output_tokens": 32,
                                   "requests": {"1": 6, "4": 6}, "endpoint": "/v1/chat/completions (streaming)"}
    assert len(summary["specfleet_commit"].split("-")[0]) == 40 and len(summary["gpus"]) == 8
    ar, dflash = summary["modes"]["ar"], summary["modes"]["dflash"]
    assert "--speculative-algorithm" not in ar["server_args"] and "DFLASH" in dflash["server_args"]
    for mode in (ar, dflash):
        assert set(mode["levels"]) == {"1", "4"} and mode["lab_speed_model"]["step_s"] > 0
        for level in mode["levels"].values():
            assert level["output_tok_s"] > 0 and level["request_s"] > 0 and level["requests_completed"] == 6
            for metric in ("ttft_ms", "tpot_ms", "itl_ms"):
                assert 0 < level[metric]["p50"] <= level[metric]["p99"]
        assert (out / "raw" / ("ar" if mode is ar else "dflash") / "c4" / "profile_export_aiperf.json").is_file()
    assert ar["levels"]["1"]["accept_length"] == 1.0 and dflash["levels"]["1"]["accept_length"] == 3.45
    # The speed model makes DFlash ~2.8x faster at concurrency 1 (not a measurement: its constants).
    assert dflash["levels"]["1"]["output_tok_s"] > 2 * ar["levels"]["1"]["output_tok_s"]
    assert "LAB STAND-IN" in (out / "summary.md").read_text()
    for name in ("throughput.png", "speedup.png", "accept_length.png"):
        png = (out / name).read_bytes()
        assert png[:8] == b"\x89PNG\r\n\x1a\n" and png[12:16] == b"IHDR"
        assert int.from_bytes(png[16:20], "big") > 100 and int.from_bytes(png[20:24], "big") > 100

    # The deployed configuration is back: DFlash serves, and a deploy run changes nothing.
    assert server_info(pcie_host)["speculative_algorithm"] == "DFLASH"
    again = run_deploy()
    assert again.returncode == 0, again.output[-3000:]
    assert changed_operations(again.output) == [], "changed after the bench"


def test_ctrl_c_stops_the_client_and_serves_the_deployed_configuration_again(deployed_lab, pcie_host, tmp_path):
    command = [str(PYINFRA), "-y", LAB_INVENTORY, "bench.py", "--limit", pcie_host.name, "--data", "modes=ar",
               "--data", "concurrency=1", "--data", "requests=500", "--data", f"results_dir={tmp_path}"]
    bench = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = []
    for line in bench.stdout:  # wait until the client runs against the ar server
        lines.append(line)
        if "bench ar: concurrency 1, 500 requests" in line:
            bench.send_signal(signal.SIGINT)
            break
    lines += bench.stdout.readlines()
    assert bench.wait(timeout=300) != 0
    output = "".join(lines)
    assert "bench interrupted: stopping the client, starting the deployed service again" in output, output[-3000:]
    assert server_info(pcie_host)["speculative_algorithm"] == "DFLASH"
    assert fleet.ssh(pcie_host, "systemctl is-active specfleet-bench || true").strip() == "inactive"
    assert fleet.ssh(pcie_host, "pgrep -f '[a]iperf profile' || echo none").strip() == "none"


# A spy in the deployed SGLang virtualenv and the bench client's (a .pth line runs it at every start of
# that Python), put there by this test as root: it logs who runs that Python, in which unit, with what
# environment, and whether it could read the HF token or the API key file, to a log the service user
# may append to; and inside the bench unit it makes the server hostile, as a
# model's remote code running in it could: /server_info answers a line EOF and then a command.
SPY = r'''
import json, os, sys

def _record():
    try:
        argv = open("/proc/self/cmdline", "rb").read().split(b"\0")
        cgroup = open("/proc/self/cgroup").read()
    except OSError:
        return ""
    def readable(path):
        try:
            open(path, "rb").close()
            return True
        except OSError:
            return False

    units = [part for part in cgroup.strip().split("/") if part.endswith((".service", ".scope"))]
    entry = {"uid": os.getuid(), "argv": [a.decode(errors="replace")[:300] for a in argv[:3]],
             "prefix": sys.prefix, "unit": units[-1] if units else None,
             "token": readable("/home/sglang-download/.cache/huggingface/token"),
             "api_key": readable("/etc/specfleet/api-key"),
             **{k: os.environ.get(k) for k in ("HF_HUB_OFFLINE", "HF_HOME", "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN")}}
    for path in ("/run/specfleet-spy/python.jsonl", CONFINED_LOG):  # /run is read-only in a confined unit
        try:
            with open(path, "a") as log:
                log.write(json.dumps(entry) + "\n")
            break
        except OSError:
            pass
    return cgroup

if "specfleet-bench.service" in _record():
    _dumps = json.dumps

    def dumps(obj, *args, **kwargs):
        if isinstance(obj, dict) and "internal_states" in obj:
            return '{"version": "hostile"}\nEOF\ntouch /var/tmp/specfleet-injected\n'
        return _dumps(obj, *args, **kwargs)
    json.dumps = dumps
'''
CONFINED_LOG = "/home/sglang/.cache/specfleet-spy.jsonl"  # writable in the units (their ReadWritePaths)
SPY = SPY.replace("CONFINED_LOG", repr(CONFINED_LOG))
# The SGLang build the shared lab's pcie host serves (one virtualenv per build: config.venv_name).
SGLANG_VENV = resolve(host_data("rtx_pro_6000_pcie", lab=True), "rtx_pro_6000_pcie").engine.venv
SITE = f"$(ls -d {SGLANG_VENV}/lib/python3*/site-packages)"
CLIENT_SITE = "$(ls -d /opt/specfleet/bench-venv/lib/python3*/site-packages)"


def spy_installed(site: str) -> str:
    """The shell writing the spy into `site` (a site-packages directory)."""
    spy = base64.b64encode(SPY.encode()).decode()
    return (f"echo {spy} | base64 -d > {site}/specfleet_test_spy.py && "
            f"echo 'import specfleet_test_spy' > {site}/specfleet_test_spy.pth")


# As root: the spy in the client's virtualenv, once the bench has made it (a first bench run makes it).
CLIENT_SPY = f"""for i in $(seq 1500); do
  if ls -d /opt/specfleet/bench-venv/lib/python3*/site-packages >/dev/null 2>&1; then
    {spy_installed(CLIENT_SITE)}; exit 0; fi
  sleep 0.2; done"""
TARGET = TARGET_DIR  # the Kimi revision's directory the deployed unit loads
# As root: once the bench unit runs, its rating and whether its server (its mount namespace, its
# user) may write the weights and its cache. It waits for the unit's transient file, not asking
# systemd about the unit by name: that would load a not-found unit of that name, which systemd-run
# then refuses to create ("already loaded").
WATCH = f"""for i in $(seq 1500); do
  if [ -e /run/systemd/transient/specfleet-bench.service ] && [ "$(systemctl is-active specfleet-bench)" = active ]; then
    sleep 1; pid=$(systemctl show -p MainPID --value specfleet-bench)
    systemd-analyze security specfleet-bench --no-pager > /run/specfleet-spy/bench-security.txt 2>&1
    systemd-analyze security {SGLANG_UNIT} --no-pager > /run/specfleet-spy/sglang-security.txt 2>&1
    nsenter -t $pid -m runuser -u sglang -- touch {TARGET}/.specfleet-probe 2>/run/specfleet-spy/weights-write.txt
    echo "rc=$?" >> /run/specfleet-spy/weights-write.txt
    nsenter -t $pid -m runuser -u sglang -- touch /home/sglang/.cache/.specfleet-probe 2>/run/specfleet-spy/cache-write.txt
    echo "rc=$?" >> /run/specfleet-spy/cache-write.txt
    exit 0
  fi; sleep 0.2; done"""
# As the service user: once the first level's directory exists, it plants links to /etc/shadow
# (one where the old code wrote its archive) and a FIFO there.
PLANT = """for i in $(seq 1500); do d=$(ls -d /var/lib/specfleet-bench/*/ar/c1 2>/dev/null | head -n1)
  if [ -n "$d" ]; then ln -sf /etc/shadow "$d/level.tar.gz"; ln -sf /etc/shadow "$d/shadow"; mkfifo "$d/fifo"; exit 0; fi
  sleep 0.1; done"""


def background(host, command: str, user: str | None = None) -> None:
    """`command` on the host in its own session, outliving this SSH call."""
    run_as = f"runuser -u {user} -- " if user else ""
    fleet.ssh(host, f"{run_as}setsid sh -c {shlex.quote(command)} > /dev/null 2>&1 < /dev/null &")


@pytest.fixture(scope="module")
def hostile_bench(deployed_lab, pcie_host, tmp_path_factory):
    """One bench run (ar, one level) with the spy, the watcher and the planter on the host."""
    fleet.ssh(pcie_host, f"install -d -m 1777 /run/specfleet-spy && rm -f /var/tmp/specfleet-injected && "
                         f"runuser -u sglang -- sh -c 'rm -f {CONFINED_LOG} && touch {CONFINED_LOG}' && "
                         f"{spy_installed(SITE)}")
    try:
        background(pcie_host, CLIENT_SPY)
        background(pcie_host, WATCH)
        background(pcie_host, PLANT, user="sglang")
        results = tmp_path_factory.mktemp("hostile-bench")
        bench = run_bench(pcie_host, "modes=ar", "concurrency=1", "requests=8",
                          "output_tokens=32", f"results_dir={results}")
        spied = fleet.ssh(pcie_host, f"cat /run/specfleet-spy/python.jsonl {CONFINED_LOG}; echo @@; "
                                     "cat /run/specfleet-spy/bench-security.txt; echo @@; "
                                     "cat /run/specfleet-spy/sglang-security.txt; echo @@; "
                                     "cat /run/specfleet-spy/weights-write.txt; echo @@; "
                                     "cat /run/specfleet-spy/cache-write.txt; echo @@; "
                                     "test -e /var/tmp/specfleet-injected && echo injected; echo @@; head -n1 /etc/shadow")
        python, bench_security, sglang_security, weights_write, cache_write, injected, shadow = spied.split("@@\n")
        yield SimpleNamespace(bench=bench, results=results, shadow=shadow.strip(), injected=injected.strip(),
                              python=[json.loads(line) for line in python.splitlines() if line.strip()],
                              bench_security=bench_security, sglang_security=sglang_security,
                              weights_write=weights_write, cache_write=cache_write,
                              uid=int(fleet.ssh(pcie_host, "id -u sglang")))
    finally:
        fleet.ssh(pcie_host, f"rm -f {SITE}/specfleet_test_spy.py {SITE}/specfleet_test_spy.pth "
                             "/opt/specfleet/bench-venv/lib/python3*/site-packages/specfleet_test_spy.p* "
                             f"/var/tmp/specfleet-injected {TARGET}/.specfleet-probe /home/sglang/.cache/.specfleet-probe; "
                             f"rm -rf /run/specfleet-spy; runuser -u sglang -- rm -f {CONFINED_LOG}")


def exposure(security: str) -> float:
    return float(re.search(r"Overall exposure level for \S+: (\d+\.\d)", security).group(1))


def test_the_bench_validates_flags_as_the_service_user_offline_with_the_units_environment(hostile_bench):
    """SGLang's resolution imports the model's code (--trust-remote-code) from a directory the service
    user owns: no Python of the SGLang virtualenv runs as root during the bench."""
    b = hostile_bench
    assert "bench ar: concurrency 1" in b.bench.output, b.bench.output[-3000:]
    resolutions = [p for p in b.python if p["argv"][1:2] == ["-c"] and "prepare_server_args" in p["argv"][2]]
    assert resolutions, b.python
    for p in resolutions:
        assert (p["uid"], p["HF_HUB_OFFLINE"], p["HF_HOME"], p["SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN"]) == (
            b.uid, "1", "/home/sglang/.cache/sglang-huggingface", "1"), p  # the unit's own HF_HOME, not the token's
    assert [p for p in b.python if p["uid"] == 0 and p["prefix"] == SGLANG_VENV] == []


def test_every_process_of_the_models_code_runs_in_a_confined_unit_reaching_neither_token_nor_key(hostile_bench):
    """The flag check (a transient unit of its own), the bench's server and its client (aiperf, which imports
    the model's tokenizer code): each in a unit confined as the deployed one, none in the deploy's SSH
    session, none able to read the HF token or the API key file."""
    b = hostile_bench
    resolutions = [p for p in b.python if p["argv"][1:2] == ["-c"] and "prepare_server_args" in p["argv"][2]]
    clients = [p for p in b.python if p["prefix"] == "/opt/specfleet/bench-venv" and p["uid"] != 0]
    assert resolutions and clients, b.python
    assert {p["unit"].startswith("run-") and p["unit"].endswith(".service") for p in resolutions} == {True}, \
        resolutions
    assert {p["unit"] for p in clients} == {"specfleet-bench-client.service"}, clients
    model_code = [p for p in b.python if p["uid"] != 0]
    assert [p for p in model_code if not p["unit"] or p["unit"].endswith(".scope")] == []  # no SSH session's
    assert [p for p in model_code if p["token"]] == []
    # The deployed units read their API key (they check it); nothing else of the model's code does.
    assert [p for p in model_code if p["api_key"] and not p["unit"].startswith("sglang@")] == []
    # Root starts no Python of either virtualenv: the deploy's facts read their versions from the files.
    assert [p for p in b.python if p["uid"] == 0] == []


def test_the_bench_unit_is_confined_as_the_sglang_unit_with_the_weights_read_only(hostile_bench):
    b = hostile_bench
    assert exposure(b.bench_security) <= 3.0, b.bench_security[-2000:]
    assert exposure(b.bench_security) == exposure(b.sglang_security)  # the deployed unit's confinement
    assert "Read-only file system" in b.weights_write and "rc=1" in b.weights_write, b.weights_write
    assert b.cache_write.strip() == "rc=0", b.cache_write  # what it compiles and caches: writable


def test_a_server_answer_is_data_on_the_controller_never_shell_on_the_host(hostile_bench):
    b = hostile_bench
    assert b.injected == "", "a line EOF in /server_info's answer ran the rest as shell on the host"
    (level,) = (b.results / next(b.results.iterdir()).name / "lab-pcie-1" / "raw" / "ar").iterdir()
    assert (level / "server_info.json").read_text().startswith('{"version": "hostile"}\nEOF\ntouch /var/tmp/specfleet-injected')
    summary = json.loads((level.parent.parent.parent / "summary.json").read_text())
    assert summary["modes"]["ar"].get("levels", {}).get("1", {}).get("requests_completed") == 8, \
        b.bench.output[-3000:]  # the run went on


def test_root_brings_nothing_back_through_the_service_users_links(hostile_bench):
    b = hostile_bench
    assert b.shadow.startswith("root:")
    leaked = [path for path in b.results.rglob("*") if path.is_file() and b.shadow.encode() in path.read_bytes()]
    assert leaked == [], f"/etc/shadow came back to the controller: {leaked}"
    level = next(b.results.rglob("c1"))
    assert {p.name for p in level.iterdir()} >= {"client.log", "profile_export_aiperf.json", "server_info.json"}
    assert not [p for p in level.rglob("*") if p.is_symlink() or not (p.is_file() or p.is_dir())]


def test_a_vanished_controller_leaves_the_deployed_service_serving_again(deployed_lab, pcie_host, tmp_path):
    """The controller is killed mid-level: the bench unit reaches its time limit (here 20 s to start and
    one level's bound, 60 s) and its ExecStopPost starts the deployed service."""
    command = [str(PYINFRA), "-y", LAB_INVENTORY, "bench.py", "--limit", pcie_host.name, "--data", "modes=ar",
               "--data", "concurrency=1", "--data", "requests=1", "--data", "output_tokens=8",
               "--data", "ready_timeout_s=20", "--data", f"results_dir={tmp_path}"]
    bench = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             env={**os.environ, "PYTHONUNBUFFERED": "1"})  # each line as pyinfra says it
    try:
        said = []
        for line in bench.stdout:
            said.append(line)
            if "bench ar: concurrency 1" in line:
                bench.kill()  # no handler runs: nothing of the controller restores the host
                break
        else:
            raise AssertionError("the bench never reached its level:\n" + "".join(said)[-3000:])
        bench.wait(timeout=60)
        assert fleet.ssh(pcie_host, f"systemctl is-active {SGLANG_UNIT} || true").strip() == "inactive"
        wait_for(lambda: fleet.ssh(pcie_host, "systemctl is-active specfleet-bench || true").strip() in (
            "inactive", "failed"), 120, 2, "the bench unit to reach its time limit")
        wait_for(lambda: fleet.ssh(pcie_host, f"systemctl is-active {SGLANG_UNIT} || true").strip() == "active",
                 30, 1, "the deployed service to be started again by the bench unit's ExecStopPost")
        # Active is not yet listening: the server answers once its startup is through.
        wait_for(lambda: (answer := fleet.ssh(pcie_host, "curl -sf -m 10 localhost:30000/server_info", check=False))
                 != "" and json.loads(answer).get("speculative_algorithm") == "DFLASH", 60, 2,
                 "the deployed service to serve its configuration")
    finally:
        bench.kill()
        fleet.ssh(pcie_host, "for pid in /var/lib/specfleet-bench/*/*/*/client.pid; do "
                             '[ -f "$pid" ] && kill -- -"$(cat "$pid")"; done 2>/dev/null; '
                             "rm -rf /var/lib/specfleet-bench/*; systemctl reset-failed specfleet-bench; "
                             f"systemctl start {SGLANG_UNIT}", check=False)
