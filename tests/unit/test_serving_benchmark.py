"""The serving benchmark's pure parts: knobs, each mode's server arguments, the report, the gate
(the lab stand-in's speed model: tests/lab_code/test_sglang_standin.py)."""

import json
from dataclasses import replace

import pytest

from serving_benchmark import client, gateways, modes, remote, report, sweep, units
from deployment.knobs import BadHostData
from serving_benchmark.modes import mode_args
from serving_benchmark.plan import PROMPTS, plan
from serving_benchmark.units import bench_unit, unit_environment
from deployment.gateway.config import resolve as resolve_gateway
from deployment.hosts import resolve, resolve_host
from operations.server.unit import unit_files
from tests.sglang_real import parse_many_with_real_sglang
from tests.unit.group_data import RTX_MINORS, host_data


def test_plan_defaults_and_refusals(tmp_path):
    default = plan({})
    assert default.modes == ("ar", "dflash", "ddtree", "mtp", "eagle3", "ngram")
    assert default.concurrency == (1, 4, 16, 64)
    assert default.requests_at(1) == 16 and default.requests_at(64) == 256 and default.tokenizer == "target"
    assert default.prompts == PROMPTS and default.prompt_count == 20
    given = plan({"modes": "dflash,ar", "concurrency": "4,1,4", "requests": "6"})
    assert given.modes == ("dflash", "ar") and given.concurrency == (1, 4) and given.requests_at(4) == 6
    mine = tmp_path / "mine.jsonl"
    mine.write_text('{"text": "Explain NCCL rings."}\n\n{"text": "Write a haiku.", "output_length": 40}\n')
    assert plan({"prompts": str(mine)}).prompt_count == 2
    assert default.each_replica is True and plan({"each_replica": "false"}).each_replica is False
    for bad in ({"modes": "ar,eagle"}, {"concurrency": "1,0"}, {"concurrency": "1;rm -rf /"}, {"each_replica": "some"},
                {"baseline": str(tmp_path / "missing.json")},
                {"max_throughput_drop": "1.5"}, {"bench_tokenizer": "/etc"}):
        with pytest.raises(ValueError):
            plan(bad)


@pytest.mark.parametrize("content, why", [
    (None, "there is no such file (a relative path is read from the directory pyinfra runs in)"),
    ("", "it holds no prompt"), (b"\xff\xfe", "it is not UTF-8 text"),
    ('{"text": "ok"}\nnot json\n', "line 2 is not a JSON object with a non-empty \"text\""),
    ('["a list"]\n', "line 1 is not a JSON object"), ('{"text": "  "}\n', "line 1 is not a JSON object"),
])
def test_a_prompts_file_is_checked_line_by_line_before_any_host(tmp_path, content, why):
    path = tmp_path / "prompts.jsonl"
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        path.write_text(content)
    with pytest.raises(BadHostData) as refused:
        plan({"prompts": str(path)})
    assert str(refused.value).startswith(f"prompts={str(path)!r} is not accepted") and why in str(refused.value)
    assert "Error" not in str(refused.value)  # words, not an exception's class name


def test_retired_knobs_say_what_replaced_them():
    with pytest.raises(BadHostData, match=r"input_tokens=32 is not accepted: the prompts' own lengths count"):
        plan({"input_tokens": 32})
    with pytest.raises(BadHostData, match="force='true' is not accepted: a worker behind a gateway is drained"):
        plan({"force": "true"})


def test_the_shipped_prompts_are_varied_and_realistic():
    prompts = [json.loads(line)["text"] for line in PROMPTS.read_text().splitlines()]
    words = sorted(len(text.split()) for text in prompts)
    assert len(prompts) == 20 and words[0] >= 15 and words[-3] >= 1400  # short asks and three long contexts
    assert sum("```" in text for text in prompts) >= 5  # code to fix, review or explain
    assert len(set(prompts)) == len(prompts)


def test_mode_args_are_the_deployed_ones_per_mode_on_loopback_and_real_sglang_accepts_them():
    kimi = resolve(host_data("rtx_pro_6000_pcie"), "rtx_pro_6000_pcie").replicas[0]
    ar, dflash = mode_args(kimi, "ar"), mode_args(kimi, "dflash")
    assert not [a for a in ar if a.startswith("--speculative")] and "--trust-remote-code" in ar
    assert ar[ar.index("--host") + 1] == dflash[dflash.index("--host") + 1] == "127.0.0.1"
    assert dflash[dflash.index("--speculative-algorithm") + 1] == "DFLASH"
    assert dflash[dflash.index("--speculative-num-draft-tokens") + 1] == "8"
    assert [r["ok"] for r in parse_many_with_real_sglang([ar, dflash])] == [True, True]

    qwen = resolve(host_data("b200_nvlink", profile="qwen36_ddtree"), "b200_nvlink").replicas[0]
    ddtree, dflash = mode_args(qwen, "ddtree"), mode_args(qwen, "dflash")
    assert ddtree[ddtree.index("--speculative-ddtree-budget") + 1] == "15" and "--page-size" in ddtree
    assert "--speculative-ddtree-budget" not in dflash and "DFLASH" in dflash
    kimi_ddtree = mode_args(kimi, "ddtree")  # a DFlash profile's drafter verified as a tree
    assert kimi_ddtree[kimi_ddtree.index("--speculative-ddtree-budget") + 1] == "7"
    assert kimi_ddtree[kimi_ddtree.index("--page-size") + 1] == "1"


def test_a_mode_the_deployed_drafter_does_not_derive_is_served_as_a_profile_of_the_model_names_it():
    data = host_data("b200_nvlink", profile="qwen36_ddtree")
    qwen = resolve(data, "b200_nvlink").replicas[0]
    settings = modes.of_model(data.profiles, "qwen36_ddtree")
    assert set(settings) >= {"ddtree", "mtp"} and "dflash" not in settings  # Qwen's profiles' algorithms
    # MTP: the model's own draft layers at qwen36_mtp's steps, on the deployed server; no drafter loaded.
    mtp = mode_args(modes.as_served(qwen, "mtp", settings), "mtp")
    assert [mtp[mtp.index(flag) + 1] for flag in ("--speculative-num-steps", "--speculative-eagle-topk",
                                                   "--speculative-num-draft-tokens")] == ["3", "1", "4"]
    assert "--speculative-draft-model-path" not in mtp and mtp[mtp.index("--host") + 1] == "127.0.0.1"
    assert parse_many_with_real_sglang([mtp])[0]["ok"]
    # DFlash is derived from the deployed drafter whatever the profiles name; AR drafts nothing.
    assert modes.as_served(qwen, "dflash", settings) is qwen and modes.as_served(qwen, "ar", settings) is qwen


def test_bench_server_environment_is_the_units_without_its_keys():
    env = unit_environment(resolve(host_data("rtx_pro_6000_pcie"), "rtx_pro_6000_pcie").replicas[0])
    assert env["HF_HUB_OFFLINE"] == "1" and "NCCL_P2P_DISABLE" not in env  # the host's decision: sweep(smoke=...)
    # Keyless on loopback: its /flush_cache (admin-optional in SGLang) takes no key either.
    assert "SPECFLEET_API_KEY_FILE" not in env and "SPECFLEET_ADMIN_API_KEY_FILE" not in env
    assert env["CUDA_VISIBLE_DEVICES"] == "0,1,2,3,4,5,6,7" and env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"


def qwen_replicas():
    [qwen] = resolve_host(host_data("rtx_pro_6000_pcie", profile="qwen36_ddtree"), "rtx_pro_6000_pcie")
    return qwen.replicas


def test_each_replica_is_benchmarked_in_its_place_on_its_gpus_and_port():
    replica = qwen_replicas()[3]
    assert bench_unit(replica, several=True) == "specfleet-bench-qwen36_ddtree-gpu3"
    assert bench_unit(replica, several=False) == "specfleet-bench"
    assert unit_environment(replica)["CUDA_VISIBLE_DEVICES"] == "3"
    args = mode_args(replica, "ar")
    assert args[args.index("--port") + 1] == "30003" and args[args.index("--tp-size") + 1] == "1"


CLIENT_EXPORT = {  # the fields read from aiperf 0.13.0's profile_export_aiperf.json (a lab run)
    "output_token_throughput": {"unit": "tokens/sec", "avg": 503.5},
    "request_throughput": {"unit": "requests/sec", "avg": 7.87},
    "completed_request_count": {"unit": "requests", "avg": 8.0},
    "time_to_first_token": {"unit": "ms", "avg": 51.4, "p50": 51.6, "p90": 60.3, "p99": 62.0},
    "inter_token_latency": {"unit": "ms", "avg": 7.1, "p50": 7.2, "p90": 7.2, "p99": 7.2},
    "inter_chunk_latency": {"unit": "ms", "avg": 25.0, "p50": 25.3, "p90": 26.4, "p99": 33.4},
    "request_latency": {"unit": "ms", "avg": 501.5, "p50": 501.9, "p90": 510.3, "p99": 510.6},
    "error_summary": [],
}


def summary_of(throughput: dict[str, float], accept: float, stand_in=True) -> dict:
    info = {"version": "0.5.23+lab", "internal_states": [{"avg_spec_accept_length": accept}],
            **({"lab_speed_model": {"step_s": 0.02}} if stand_in else {})}
    modes = {"ar": {"server_args": ["--port", "30000"], "server_info": info, "levels": {}},
             "ddtree": {"skipped": "ddtree skipped: no DDTree build is deployed"}}
    for level, tok_s in throughput.items():
        export = {**CLIENT_EXPORT, "output_token_throughput": {"avg": tok_s}}
        modes["ar"]["levels"][level] = report.level_result(export, info)
    meta = {"host": "h", "host_class": "b200_nvlink", "profile": "qwen36_ddtree", "started": "r",
            "specfleet_commit": "c", "client": "aiperf==0.13.0", "gpus": [],
            "workload": {"prompts": "prompts.jsonl", "prompt_count": 20, "output_tokens": 64}}
    return report.summary(meta, modes)


def test_the_table_shows_all_replicas_at_once_then_each_alone():
    doc = summary_of({"1": 800.0}, 1.0)
    doc["layout"] = {"deployment": "qwen36_ddtree", "tp_size": 1, "replicas": {"sglang@q-gpu0": [0], "sglang@q-gpu1": [1]}}
    doc["replicas"] = {name: {"ar": {"levels": {"1": report.level_result(
        {**CLIENT_EXPORT, "output_token_throughput": {"avg": 400.0}}, {})}}} for name in doc["layout"]["replicas"]}
    table = report.markdown(doc)
    assert "2 replicas at TP 1" in table and "| ar | 1 | 800.0 |" in table
    assert "| sglang@q-gpu0 | ar | 1 | 400.0 |" in table and "| sglang@q-gpu1 | ar | 1 | 400.0 |" in table


def test_summary_table_and_plots(tmp_path):
    doc = summary_of({"1": 100.0, "4": 350.0}, 1.0)
    level = doc["modes"]["ar"]["levels"]["4"]
    assert level["output_tok_s"] == 350.0 and level["ttft_ms"]["p99"] == 62.0 and level["itl_ms"]["p50"] == 25.3
    assert level["tpot_ms"]["p50"] == 7.2 and level["accept_length"] == 1.0 and level["request_s"] == 7.87
    assert doc["stand_in"] and doc["note"] == report.STAND_IN_LABEL and doc["sglang_version"] == "0.5.23+lab"
    assert doc["modes"]["ddtree"] == {"skipped": "ddtree skipped: no DDTree build is deployed"}
    assert not summary_of({"1": 1.0}, 1.0, stand_in=False)["stand_in"]
    written = report.write_report(doc, tmp_path)
    assert json.loads((tmp_path / "summary.json").read_text()) == doc
    table = (tmp_path / "summary.md").read_text()
    assert "| ar | 4 | 350.0 | 1.00x |" in table and "LAB STAND-IN" in table and "no DDTree build" in table
    assert "20 prompts of prompts.jsonl, 64 output tokens" in table
    assert report.ITL_NOTE not in table  # AR alone: every chunk is one token
    with_dflash = {**doc, "modes": {**doc["modes"], "dflash": doc["modes"]["ar"]}}
    assert report.markdown(with_dflash).count(report.ITL_NOTE) == 1 and "several tokens" in report.ITL_NOTE
    for png in written[2:]:
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_any_set_of_modes_is_shown_side_by_side_a_column_each_with_its_speedup_and_accept_length():
    doc = summary_of({"1": 100.0, "64": 900.0}, 1.0)
    ar = doc["modes"]["ar"]["levels"]
    level = {"1": {**ar["1"], "output_tok_s": 450.0, "accept_length": 5.2},
             "64": {**ar["64"], "output_tok_s": 800.0, "accept_length": 5.1}}
    doc["modes"] = {**doc["modes"], "mtp": {"levels": {"1": {**ar["1"], "output_tok_s": 250.0, "accept_length": 2.9}}},
                    "dflash": {"levels": level}}
    lines = report.markdown(doc).splitlines()
    head = lines.index("| concurrency | ar | mtp | dflash |")
    assert lines[head + 2:head + 4] == [
        "| 1 | 100.0 (1.00x, 1.00) | 250.0 (2.50x, 2.90) | **450.0 (4.50x, 5.20)** |",
        "| 64 | **900.0 (1.00x, 1.00)** | - | 800.0 (0.89x, 5.10) |"]
    assert "| concurrency | ar |" not in report.markdown(summary_of({"1": 100.0}, 1.0))  # one mode: nothing beside it


def test_gate_fails_on_throughput_or_accept_length_drops_beyond_the_limits():
    baseline = summary_of({"1": 100.0, "4": 400.0}, 4.0)
    assert report.regressions(summary_of({"1": 91.0, "4": 400.0}, 3.85), baseline) == []
    worse = report.regressions(summary_of({"1": 89.0, "4": 400.0}, 3.7), baseline)
    assert [(r["concurrency"], r["metric"]) for r in worse] == [
        ("1", "output tok/s"), ("1", "accept length"), ("4", "accept length")]
    assert "| ar | 1 | output tok/s | 100.00 | 89.00 | -11.0% | -10% |" in report.regression_table(worse)
    assert report.regressions(summary_of({"1": 89.0}, 4.0), baseline, max_throughput_drop=0.2) == []
    other = {**baseline, "profile": "kimi_k26_dflash"}
    with pytest.raises(ValueError, match="same class and profile"):
        report.regressions(summary_of({"1": 100.0}, 4.0), other)
    with pytest.raises(ValueError, match="none of this run's"):
        report.regressions(summary_of({"16": 100.0}, 4.0), baseline)


def test_a_level_archive_unpacks_files_only_whatever_the_service_user_left_in_it(tmp_path):
    """Links (out of the directory or not) and FIFOs are left out; files and directories come back."""
    import io
    import os
    import tarfile
    from serving_benchmark.remote import files_only as _files_only
    source = tmp_path / "level"
    (source / "sub").mkdir(parents=True)
    (source / "client.log").write_text("log")
    (source / "sub" / "inner.json").write_text("{}")
    (source / "shadow").symlink_to("/etc/shadow")
    (source / "local-link").symlink_to("client.log")
    os.mkfifo(source / "fifo")
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        archive.add(source, arcname=".")
    (tmp_path / "out").mkdir()
    buffer.seek(0)
    with tarfile.open(fileobj=buffer) as archive:
        archive.extractall(tmp_path / "out", filter=_files_only)
    found = sorted(str(p.relative_to(tmp_path / "out")) for p in (tmp_path / "out").rglob("*"))
    assert found == ["client.log", "sub", "sub/inner.json"]


def test_the_bench_unit_runs_confined_as_the_deployed_unit_and_roots_stop_restores_it():
    replica = resolve(host_data("rtx_pro_6000_pcie"), "rtx_pro_6000_pcie").replicas[0]
    command = units.bench_unit_command(replica, mode_args(replica, "ar"), 600, RTX_MINORS)
    properties = [arg.removeprefix("--property=") for arg in command if arg.startswith("--property=")]
    unit_text, _ = unit_files(replica, "", RTX_MINORS)
    for setting in ("User=sglang", "NoNewPrivileges=yes", "ProtectSystem=strict", "CapabilityBoundingSet=",
                    "DevicePolicy=closed", "KillMode=mixed"):
        assert setting in unit_text and setting in properties, setting  # the deployed unit's, one source
    assert "--uid" not in " ".join(command)  # the user is the unit's User=, not an unconfined --uid
    # Root's (+): the service user may not start a system unit when the controller is gone.
    assert f"ExecStopPost=+/bin/sh -c 'test -e /run/specfleet-bench.switching || systemctl start --no-block " \
           f"{replica.service_name}'" in properties
    assert "RuntimeMaxSec=600" in properties


def test_through_the_gateway_the_client_sends_to_the_gateway_with_the_key_file_never_the_key():
    replicas = qwen_replicas()
    d, bench_plan = replicas[0], plan({})
    alone = client.client_command(d, bench_plan, "/var/lib/specfleet-bench/r/all/ar/c4", 4,
                                 [f"http://127.0.0.1:{r.port}" for r in replicas])
    assert alone[3] == "" and alone.count("--url") == 8 and "--api-key" not in alone
    assert "--no-server-metrics" not in alone  # aiperf scrapes each SGLang server's /metrics
    through = client.client_command(d, bench_plan, "/var/lib/specfleet-bench/r/gateway-g/ddtree/c4", 4,
                                   ["http://127.0.0.1:30080"], through_gateway=True)
    assert through[:4] == ["/opt/specfleet/bench-venv/bin/python", "-c", client.CLIENT, "/etc/specfleet/api-key"]
    assert through[through.index("--url") + 1] == "http://127.0.0.1:30080" and through.count("--url") == 1
    assert "--no-server-metrics" in through  # smg's metrics are on a port of their own
    # The key is read inside the client's own process and added to aiperf's arguments there.
    assert "--api-key" not in through and "'--api-key', key" in client.CLIENT


def test_a_gateway_is_benchmarked_only_when_its_workers_of_the_model_are_exactly_this_hosts_replicas():
    from deployment.gateway.membership import Route
    replicas = qwen_replicas()
    route = Route("ct200", resolve_gateway(host_data("gateway", profile="qwen36_ddtree")), "127.0.0.1", "127.0.0.1")
    ours = [{"url": f"http://127.0.0.1:{r.port}", "status": "ready"} for r in replicas]
    assert gateways.gateway_problem({"reachable": True, "workers": ours}, route, replicas) is None
    shared = {"reachable": True, "workers": [*ours, *({"url": f"http://10.0.0.{i}:30000"} for i in range(2, 6))]}
    assert gateways.gateway_problem(shared, route, replicas) == (
        "ct200 also routes qwen3.6-27b to 4 other worker(s) (http://10.0.0.2:30000, http://10.0.0.3:30000, "
        "http://10.0.0.4:30000, ...): its figures would not be this host's alone")
    assert gateways.gateway_problem({"reachable": True, "workers": ours[1:]}, route, replicas) == \
        "ct200 does not route to http://127.0.0.1:30000"
    assert gateways.gateway_problem({"reachable": False, "workers": [], "error": "refused"}, route, replicas) == \
        "ct200 did not answer (refused)"
    # A gateway on another host's loopback: this host's client cannot reach it (its drain runs on its own host).
    assert gateways.gateway_problem({"reachable": True, "workers": ours}, replace(route, address=""), replicas) == \
        "its API listens on 127.0.0.1 only, which this host's client cannot reach"
    # The gateway's inventory name becomes a directory on the host and the controller: nothing a shell or a path reads.
    for name in ("../../etc", "gw; rm -rf /", ".hidden"):
        problem = gateways.gateway_problem({"reachable": True, "workers": ours}, replace(route, gateway=name), replicas)
        assert problem == (f"its inventory name {name!r} is not a plain name (letters, digits, _.-), which its "
                           "results' directory takes")


def test_generated_tokens_are_sglangs_counter_summed_over_its_label_sets():
    metrics = ("# TYPE sglang:generation_tokens_total counter\n"
               'sglang:generation_tokens_total{model_name="qwen3.6-27b",tp_rank="0"} 1200.0\n'
               'sglang:generation_tokens_total{model_name="qwen3.6-27b",tp_rank="1"} 34.0\n'
               'sglang:prompt_tokens_total{model_name="qwen3.6-27b"} 999.0\n')
    assert gateways.generated_tokens(metrics) == 1234.0 and gateways.generated_tokens("") == 0


def test_the_gateway_pass_has_its_table_and_its_own_place_in_the_gate():
    doc = summary_of({"4": 800.0}, 3.0)
    through = report.level_result({**CLIENT_EXPORT, "output_token_throughput": {"avg": 760.0}},
                                  {"internal_states": [{"avg_spec_accept_length": 3.1}]})
    doc["gateways"] = {"ct200": {"url": "http://127.0.0.1:30080", "mode": "ddtree", "levels": {"4": through},
                                 "generated_tokens": {"sglang@q-gpu0": 520, "sglang@q-gpu1": 504}},
                       "lab-gateway-1": {"skipped": "through lab-gateway-1 skipped: it also routes elsewhere"}}
    table = report.markdown(doc)
    assert "## Through the gateway ct200" in table and "| 4 | 760.0 | 7.87 | 51.6 |" in table
    assert "Tokens each replica generated meanwhile: sglang@q-gpu0 520, sglang@q-gpu1 504." in table
    assert "through lab-gateway-1 skipped: it also routes elsewhere" in table
    slower = json.loads(json.dumps(doc))
    slower["gateways"]["ct200"]["levels"]["4"]["output_tok_s"] = 600.0
    worse = report.regressions(slower, doc)
    assert [(r["mode"], r["concurrency"], r["metric"]) for r in worse] == [("ddtree via ct200", "4", "output tok/s")]
    assert report.regressions(doc, summary_of({"4": 800.0}, 3.0)) == []  # a baseline without the gateway pass



def test_the_prompts_file_is_the_operators_readable_by_the_service_group_alone():
    from pyinfra.facts.files import Directory, File
    from tests.unit.fakehost import run
    service = resolve(host_data("rtx_pro_6000_pcie", lab=True), "rtx_pro_6000_pcie").host.service
    commands, _ = run(client.prompts, {File: None, Directory: None}, service=service, plan=plan({}))
    assert f"chown root:{service.service_user} {client.prompts_path(service)}" in commands
    assert f"chmod 640 {client.prompts_path(service)}" in commands


def test_server_info_is_kept_with_the_keys_it_holds_masked():
    """SGLang 0.5.23's /server_info holds api_key, admin_api_key and the launch command with --api-key=KEY
    (build_server_info): what the bench keeps of it (server_info.json, the summary) holds neither key."""
    key, admin = "sk-bench-0123456789abcdef", "adm-bench-fedcba9876543210"
    answer = json.dumps({"api_key": key, "admin_api_key": admin, "version": "0.5.23", "speculative_algorithm": "DFLASH",
                         "launch_command": f"--model-path /srv/m --admin-api-key {admin} --api-key={key}"})
    info = remote.server_info(answer)
    assert key not in json.dumps(info) and admin not in json.dumps(info)
    assert info["api_key"] == info["admin_api_key"] == "***" and info["speculative_algorithm"] == "DFLASH"
    assert info["launch_command"] == "--model-path /srv/m --admin-api-key *** --api-key=***"


def test_the_client_runs_on_each_replica_alone_then_on_all_unless_each_replica_is_false():
    replicas = tuple(type("Replica", (), {"service_name": f"sglang@qwen-gpu{i}"})() for i in range(3))
    names = [name for name, _ in sweep.client_runs(replicas, plan({}))]
    assert names == ["sglang@qwen-gpu0", "sglang@qwen-gpu1", "sglang@qwen-gpu2", "all"]
    assert [(n, len(t)) for n, t in sweep.client_runs(replicas, plan({"each_replica": "false"}))] == [("all", 3)]
    assert [(n, t) for n, t in sweep.client_runs(replicas[:1], plan({"each_replica": "false"}))] == [("", replicas[:1])]
    assert sweep.client_runs(replicas[:1], plan({})) == [("", replicas[:1])]
