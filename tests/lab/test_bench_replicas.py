"""bench.py over Qwen3.6-27B's TP 1 replicas on one lab host, each alone and then all at once.

Its own module, beside test_serving_benchmark.py, so that another worker of make test runs it (its
deploy, a client run a replica and one over all, and the deploy back are the longest part of the bench's
tests). Two replicas (the class's layout cut to two GPUs) make the same passes as eight, with a third of the
client runs; test_replicas.py benches the eight through a gateway.
"""

import json

import pytest

from lab import fleet
from tests.helpers import main_pid, run_deploy, server_info, serving, write_group_data
from tests.lab.test_serving_benchmark import run_bench

pytestmark = pytest.mark.lab

REPLICAS = 2


def test_bench_follows_the_layout_each_replica_alone_then_all_at_once(deployed_lab, pcie_host, tmp_path):
    """Qwen3.6-27B's TP 1 replicas on lab-pcie-1: each mode stands in for every replica on its GPU and port,
    the client runs against each replica alone and then all at once (round robin); the deployed replicas
    serve again afterwards."""
    two_replicas = serving("qwen36_ddtree", tmp_path / "group_data")
    write_group_data(two_replicas, "rtx_pro_6000_pcie", "layouts = dict(base['layouts'], qwen36_ddtree=dict("
                                               f"base['layouts']['qwen36_ddtree'], replicas={REPLICAS}))")
    results = tmp_path / "results"
    try:
        deployed = run_deploy("--limit", pcie_host.name, group_data=two_replicas)
        assert deployed.returncode == 0, deployed.output[-3000:]
        pids = {i: main_pid(pcie_host, f"sglang@qwen36_ddtree-gpu{i}") for i in range(REPLICAS)}
        bench = run_bench(pcie_host, "profile=qwen36_ddtree", "modes=dflash", "concurrency=2", "requests=2",
                          "output_tokens=8", f"results_dir={results}", group_data=two_replicas)
        assert bench.returncode == 0, bench.output[-3000:]
        (run,) = results.iterdir()
        out = run / pcie_host.name
        summary = json.loads((out / "summary.json").read_text())
        replicas = [f"sglang@qwen36_ddtree-gpu{i}" for i in range(REPLICAS)]
        assert summary["layout"] == {"deployment": "qwen36_ddtree", "tp_size": 1,
                                     "replicas": {name: [i] for i, name in enumerate(replicas)}}
        assert sorted(summary["replicas"]) == replicas
        for name in replicas:
            level = summary["replicas"][name]["dflash"]["levels"]["2"]
            assert level["requests_completed"] == 2 and level["output_tok_s"] > 0
            assert (out / "raw" / name / "dflash" / "c2" / "profile_export_aiperf.json").is_file()
        everything = summary["modes"]["dflash"]["levels"]["2"]
        assert everything["requests_completed"] == 2 and (out / "raw" / "all" / "dflash" / "c2").is_dir()
        assert f"| sglang@qwen36_ddtree-gpu{REPLICAS - 1} | dflash | 2 |" in (out / "summary.md").read_text()
        # Every deployed replica serves again (restarted: the bench stood in for each).
        for i in range(REPLICAS):
            assert main_pid(pcie_host, f"sglang@qwen36_ddtree-gpu{i}") != pids[i]
            assert server_info(pcie_host, 30000 + i)["speculative_algorithm"] == "DDTREE"
        assert fleet.ssh(pcie_host, "systemctl list-units --no-legend 'specfleet-bench*'").strip() == ""
    finally:
        assert run_deploy("--limit", pcie_host.name).returncode == 0
