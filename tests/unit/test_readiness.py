"""operations.readiness: crash-loop verdicts, the unit's run as systemd shows it, the default timeout."""

from types import SimpleNamespace

from operations.server import readiness
from operations.server.readiness import ServerProbe, ServiceRun, crash, ready_timeout


def run(active="activating", sub="start", restarts=0, exit_status="0", result="success", progress=None):
    return dict(active=active, sub=sub, restarts=restarts, exit_status=exit_status, result=result, progress=progress)


def test_a_loading_server_is_waited_for():
    assert crash(run(active="active", sub="running"), restarts_before=4) is None
    # Two deaths: may still be a slow host's flake.
    assert crash(run(sub="auto-restart", restarts=5, exit_status="1"), restarts_before=4) is None


def test_three_deaths_since_the_restart_are_a_crash_loop():
    # systemd does not reset NRestarts on a manual restart: deaths count from the first look.
    assert crash(run(sub="auto-restart", restarts=6, exit_status="1"), restarts_before=4) == \
        "the server died 3 times since the restart (last exit status 1)"
    assert crash(run(active="active", sub="running", restarts=7), restarts_before=4).startswith("the server died 3 times")


def test_a_usage_error_or_a_failed_unit_needs_no_third_death():
    assert crash(run(sub="auto-restart", restarts=0, exit_status="2"), 0) == "SGLang refused its arguments (exit status 2)"
    assert crash(run(active="failed", sub="failed", result="start-limit-hit", exit_status="1"), 0) == \
        "the service failed (start-limit-hit, exit status 1)"


def test_service_run_reads_systemctl_show_and_the_progress_line():
    output = ["ActiveState=activating", "SubState=start", "Result=success", "NRestarts=3", "ExecMainStatus=0",
              "Progress=Loading safetensors checkpoint shards:  50% Completed | 32/64 [01:02<01:02]"]
    assert ServiceRun().process(output) == run(restarts=3, progress=(
        "Loading safetensors checkpoint shards:  50% Completed | 32/64 [01:02<01:02]"))
    assert ServiceRun().process(output[:-1] + ["Progress="])["progress"] is None


def test_progress_lines_are_sglangs_load_steps():
    lines = ["Load weight begin. avail mem=180.12 GB", "Capture cuda graph begin. This can take up to several minutes.",
             "Loading safetensors checkpoint shards:  10% Completed | 6/64", "The server is fired up and ready to roll!"]
    assert all(readiness.LOAD_PROGRESS.search(line) for line in lines)
    assert not readiness.LOAD_PROGRESS.search('INFO:     127.0.0.1 - "GET /health_generate HTTP/1.1" 503')


def test_the_default_timeout_follows_the_weights_size():
    assert ready_timeout(595_000_000_000) == 1787  # Kimi K2.6 on 8 GPUs: ~30 min
    assert ready_timeout(54_000_000_000) == 435  # Qwen3.6-27B
    assert ready_timeout(30_000_000) == 300  # the lab's tiny repos


def test_server_probe_reads_the_last_json_line_else_reports_the_output():
    assert ServerProbe().process(["noise", '{"ready": true, "completion": "x"}']) == {"ready": True, "completion": "x"}
    assert ServerProbe().process(["Traceback", "boom"]) == {"ready": False, "error": "Traceback boom"}
    assert ServerProbe().command("/opt/specfleet", 30000, "kimi-k2.6", "/etc/specfleet/api-key", "sglang") == (
        "python3 /opt/specfleet/bin/probe_server.py 30000 kimi-k2.6 /etc/specfleet/api-key sglang 2>&1 || true")


def test_a_completion_is_generating_whatever_server_info_answered():
    speculative = {"ready": True, "generated": True, "completion": "Drafts verified.", "algorithm": "DFLASH",
                   "accept_length": 3.4}
    assert readiness.generates(speculative)
    assert readiness.generates({**speculative, "algorithm": None})  # the serving benchmark's AR mode
    # /server_info failing after the completion (a hostile or busy server): generating all the same.
    assert readiness.generates({"ready": True, "generated": True, "completion": "x",
                                "error": "Extra data: line 2 column 1"})
    assert not readiness.generates({"ready": True, "algorithm": "DFLASH"})
    assert not readiness.generates({"ready": False, "generated": True, "completion": "x"})
    assert not readiness.generates({"ready": True, "generated": False, "completion": ""})


def test_the_serving_line_says_when_server_info_was_unread():
    said = []
    host = SimpleNamespace(name="h", log_styled=lambda text, **_: said.append(text))  # outside a run: no notes
    readiness.log_serving(host, {"ready": True, "completion": "x", "error": "Extra data: line 2 column 1"}, "u")
    assert said == ["serving unread (/server_info: Extra data: line 2 column 1) (draft tokens None): accept "
                    "length None; KV cache unread; completion: 'x'"]
    readiness.log_serving(host, {"ready": True, "completion": "x", "error": "\x1b[2J\x1b[1;1Hready"}, "u")
    assert said[-1].startswith("serving unread (/server_info: \\x1b[2J\\x1b[1;1Hready) (draft")


def test_a_server_without_speculation_is_said_to_serve_ar():
    """/server_info's speculative_algorithm is None on a server without speculation (a profile without a
    drafter, served AR): the deploy's line and summary say AR, not None."""
    said = []
    host = SimpleNamespace(name="h", log_styled=lambda text, **_: said.append(text))
    readiness.log_serving(host, {"ready": True, "generated": True, "completion": "x", "algorithm": None,
                                 "num_draft_tokens": None, "accept_length": 1.0}, "u")
    assert said[-1].startswith("serving AR (draft tokens None): accept length 1.0;")


def test_what_the_probe_printed_is_kept_with_its_secrets_masked():
    line = '{"ready": false, "error": "HTTP Error 500: --api-key=sk-0123456789"}'
    assert ServerProbe().process([line]) == {"ready": False, "error": "HTTP Error 500: --api-key=***"}
    assert ServerProbe().process(["Traceback", "--admin-api-key adm-1"])["error"] == "Traceback --admin-api-key ***"
