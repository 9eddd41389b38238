"""What a long deploy shows: the downloads' rate and time left, and the run's closing table."""

import re
from types import SimpleNamespace

from deployment.gateway import config as gateway_config
from deployment.hosts import resolve, resolve_host
from operations.run.summary import Row, row, state_of, table
from operations.weights.download import Rate, duration, progress
from tests.unit.group_data import host_data


def test_download_progress_shows_the_rate_over_the_last_half_minute_and_the_time_left():
    rate = Rate()
    rate.add(0.0, 0)
    assert progress(0, 595_000_000_000, rate.bytes_per_s()) == "weights: 0.00 / 595.00 GB (0%)"  # no rate yet
    rate.add(10.0, 4_000_000_000)
    assert progress(4_000_000_000, 595_000_000_000, rate.bytes_per_s()) == \
        "weights: 4.00 / 595.00 GB (1%), 400 MB/s, 25 min left"
    for second in range(20, 100, 10):  # the link stalls after 40 s: the window forgets the fast start
        rate.add(float(second), 16_000_000_000 if second >= 40 else 4_000_000_000 + second * 400_000_000)
    assert progress(16_000_000_000, 595_000_000_000, rate.bytes_per_s()).endswith("no bytes in the last 30 s")
    assert [duration(s) for s in (45, 600, 12_000)] == ["45 s", "10 min", "3 h 20 min"]


def inventory_host(name, groups, **data):
    return SimpleNamespace(name=name, groups=groups, data=SimpleNamespace(get=data.get, **data))


def test_each_host_gets_one_row_with_class_model_endpoint_gateway_state_and_accept_length():
    kimi = resolve(host_data("rtx_pro_6000_pcie"), "rtx_pro_6000_pcie")
    wide = resolve(host_data("b200_nvlink", bind_address="0.0.0.0"), "b200_nvlink")
    gateway = gateway_config.resolve(host_data("rtx_pro_6000_pcie", **vars(host_data("gateway"))))
    rows = [row(inventory_host("ct200", ["rtx_pro_6000_pcie", "gateway"]), kimi.host, (kimi,), gateway),
            row(inventory_host("b200-a", ["b200_nvlink"], ssh_hostname="10.1.0.7"), wide.host, (wide,), None,
                ("ct200",)),
            row(inventory_host("b200-b", ["b200_nvlink"]), None, (), None)]
    assert rows[0] == Row("ct200", "rtx_pro_6000_pcie", "kimi-k2.6", "http://127.0.0.1:30000 (on the host)",
                          "http://127.0.0.1:30080 (on the host)")
    assert rows[1].endpoint == "http://10.1.0.7:30000" and rows[2].host_class == "b200_nvlink"
    notes = {"ct200": {"serving": "DFLASH", "accept_length": 3.45, "gateway_workers": 2,
                       "kv_engine": {"sglang@kimi_k26_dflash-gpu0-7": 215040},
                       "kv_planned": {"sglang@kimi_k26_dflash-gpu0-7": 222016},
                       "weights_received": {"hub": 2_000_000, "peers": 4_000_000, "seconds": 2.0}},
             "b200-a": {"serving": "DFLASH", "accept_length": 3.1,
                        "kv_planned": {"sglang@a": 1401659, "sglang@b": 1401659}, "kv_engine": {"sglang@a": None}},
             "b200-b": {"refused": "b200-b: install_driver='maybe' is not a boolean: use true/false"}}
    lines = table(rows, {"b200-b"}, notes)
    cells = [re.split(r"\s{2,}", line) for line in lines]
    assert cells[0] == ["host", "class", "model", "endpoint", "gateway", "state", "accept length",
                        "KV tokens (engine of plan)", "weights fetched (hub, peers, rate)"]
    # Its downloads' bytes from the hub and from its peers (the weights' fan-out), at their rate.
    assert cells[1] == ["ct200", "rtx_pro_6000_pcie", "kimi-k2.6", "http://127.0.0.1:30000 (on the host)",
                        "http://127.0.0.1:30080 (on the host)", "serving DFLASH, gateway routing to 2 workers", "3.45",
                        "215,040 of 222,016", "2.0 MB, 4.0 MB, 3.0 MB/s"]
    # Each replica's engine beside its plan, replicas alike once and counted; a figure the run did not learn
    # (an unread /server_info) is "-". A worker behind a gateway names it.
    assert cells[2][3:] == ["http://10.1.0.7:30000", "behind ct200", "serving DFLASH", "3.1", "2 x - of 1,401,659",
                            "-"]
    assert lines[-1].startswith("KV tokens: each replica's engine (its max_total_num_tokens) of the deploy's plan")
    assert "before the pool" in lines[-1] and len(lines) == 5  # said once, under the table
    assert cells[3][6:] == ["-", "-", "-"]
    assert cells[3][5] == "failed: b200-b: install_driver='maybe' is not a boolean: use true/false"
    assert len({line.index("kimi-k2.6") for line in lines[1:3]}) == 1  # columns line up
    long = state_of(True, {"refused": "x" * 200})
    assert len(long) == len("failed: ") + 80 and long.endswith("...")
    assert state_of(True, {}) == "failed (its lines above say why)" and state_of(False, {}) == "done"


def test_a_host_of_replicas_and_two_models_shows_each_deployments_ports():
    both = resolve_host(host_data("rtx_pro_6000_pcie", bind_address="0.0.0.0", deployments=[
        dict(profile="kimi_k26_dflash", gpus=[0, 1, 2, 3], tp_size=4), dict(profile="qwen36_ddtree", gpus=[4, 5, 6, 7])]),
        "rtx_pro_6000_pcie")
    found = row(inventory_host("ct200", ["rtx_pro_6000_pcie"], ssh_hostname="10.1.0.9"), both[0].host, both, None)
    assert found.model == "kimi-k2.6, qwen3.6-27b"
    assert found.endpoint == "http://10.1.0.9:30000; http://10.1.0.9:30004-30007 (4 replicas)"
