"""bench.py end to end on one lab host: two modes, two levels, a few requests against the
stand-in engine (its speed model makes the numbers: modelled, not measured)."""

import json
import signal
import subprocess

import pytest

from lab import fleet
from tests.helpers import LAB_INVENTORY, PYINFRA, REPO, main_pid, results_table, run_deploy, server_info

pytestmark = pytest.mark.lab


def run_bench(host, *data: str, inventory: str = LAB_INVENTORY) -> subprocess.CompletedProcess:
    command = [str(PYINFRA), "-y", inventory, "bench.py", "--limit", host.name,
               *(arg for item in data for arg in ("--data", item))]
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=900)
    result.output = result.stdout + result.stderr
    return result


def test_bench_refuses_a_host_behind_a_gateway_unless_forced(deployed_lab, pcie_host):
    refused = run_bench(pcie_host, "modes=nope")
    assert refused.returncode != 0 and "modes='nope'" in refused.output  # knobs are checked first
    # The lab's inventory with a gateway host serving the lab's model (never connected to: --limit).
    behind = REPO / "build" / "inventory_behind_gateway.py"
    behind.parent.mkdir(exist_ok=True)
    behind.write_text("from lab.inventory import *  # noqa: F401,F403\n"
                      "gateway = [('gw-elsewhere', {'ssh_hostname': '10.0.0.1', 'gateway_bind_address': '0.0.0.0'})]\n")
    refused = run_bench(pcie_host, inventory=str(behind.relative_to(REPO)))
    assert refused.returncode != 0, refused.output[-2000:]
    assert "the gateway gw-elsewhere routes requests to this host" in refused.output
    assert "--data force=true" in refused.output
    assert "Starting operation: Benchmark client" not in refused.output


def test_bench_sweeps_modes_brings_results_back_restores_the_deployment_and_gates(deployed_lab, pcie_host,
                                                                                 tmp_path):
    # The same class and profile with a far higher throughput at one level: the gate must fail.
    baseline = tmp_path / "baseline.json"
    baseline.write_text(json.dumps({"host_class": "rtx_pro_6000_pcie", "profile": "kimi_k26_dflash", "modes": {
        "dflash": {"levels": {"4": {"output_tok_s": 1e6, "accept_length": 3.45}}}}}))
    results = tmp_path / "results"
    bench = run_bench(pcie_host, "modes=ar,dflash", "concurrency=1,4", "requests=6", "input_tokens=32",
                      "output_tokens=32", f"results_dir={results}", f"baseline={baseline}")

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
    for operation, (hosts, success, error, no_change) in results_table(again.output).items():
        assert (success, error) == ("-", "-") and no_change == hosts, f"{operation} changed after the bench"


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


def test_bench_follows_the_layout_each_replica_alone_then_all_at_once(deployed_lab, pcie_host, tmp_path):
    """Qwen3.6-27B's eight TP 1 replicas on lab-pcie-1: each mode stands in for every replica on its GPU
    and port, the client runs against each replica alone and then all at once (round robin); the
    deployed replicas serve again afterwards."""
    qwen = ("--data", "profile=qwen36_ddtree")
    try:
        assert run_deploy("--limit", pcie_host.name, *qwen).returncode == 0
        pids = {i: main_pid(pcie_host, f"sglang@qwen36_ddtree-gpu{i}") for i in range(8)}
        bench = run_bench(pcie_host, "profile=qwen36_ddtree", "modes=dflash", "concurrency=2", "requests=2",
                          "input_tokens=16", "output_tokens=8", f"results_dir={tmp_path}")
        assert bench.returncode == 0, bench.output[-3000:]
        (run,) = tmp_path.iterdir()
        out = run / pcie_host.name
        summary = json.loads((out / "summary.json").read_text())
        replicas = [f"sglang@qwen36_ddtree-gpu{i}" for i in range(8)]
        assert summary["layout"] == {"deployment": "qwen36_ddtree", "tp_size": 1,
                                     "replicas": {name: [i] for i, name in enumerate(replicas)}}
        assert sorted(summary["replicas"]) == replicas
        for name in replicas:
            level = summary["replicas"][name]["dflash"]["levels"]["2"]
            assert level["requests_completed"] == 2 and level["output_tok_s"] > 0
            assert (out / "raw" / name / "dflash" / "c2" / "profile_export_aiperf.json").is_file()
        everything = summary["modes"]["dflash"]["levels"]["2"]
        assert everything["requests_completed"] == 2 and (out / "raw" / "all" / "dflash" / "c2").is_dir()
        assert "| sglang@qwen36_ddtree-gpu7 | dflash | 2 |" in (out / "summary.md").read_text()
        # Every deployed replica serves again (restarted: the bench stood in for each).
        for i in range(8):
            assert main_pid(pcie_host, f"sglang@qwen36_ddtree-gpu{i}") != pids[i]
            assert server_info(pcie_host, 30000 + i)["speculative_algorithm"] == "DDTREE"
        assert fleet.ssh(pcie_host, "systemctl list-units --no-legend 'specfleet-bench*'").strip() == ""
    finally:
        assert run_deploy("--limit", pcie_host.name).returncode == 0
