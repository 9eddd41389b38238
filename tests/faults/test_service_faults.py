"""The server under faults: flags SGLang rejects, a restart that never gets ready, a crash, a restart
during a long generation."""

import json
import threading
import time
from datetime import datetime, timezone

import pytest

from lab import fleet
from operations.server.host_scripts.engine_answers import NO_THINKING
from tests.helpers import SGLANG_UNIT, UNIT_FILE, run_deploy, write_group_data
from tests.faults.faultlab import http_status, record, set_knobs, wait_for
from tests.helpers import main_pid, operations_started, server_info

pytestmark = pytest.mark.lab

UNIT = UNIT_FILE


def unit_sha(host) -> str:
    return fleet.ssh(host, f"sha1sum {UNIT}")


def test_flag_the_installed_sglang_rejects_fails_before_restart_naming_it(deployed_lab, pcie_host, tmp_path):
    host = pcie_host
    pid, unit = main_pid(host), unit_sha(host)
    bad = write_group_data(tmp_path, "rtx_pro_6000_pcie", (
        "sglang_tuning = copy.deepcopy(base['sglang_tuning'])\n"
        "sglang_tuning['attention_backends']['mla'] = ('flashmla_v9', 'flashinfer')"))
    result = run_deploy("--limit", host.name, group_data=bad)
    assert result.returncode != 0
    line = next((l for l in result.output.splitlines() if "rejects the rendered flags" in l), "")
    assert "--attention-backend" in line and "flashmla_v9" in line, result.output[-3000:]
    assert f"{SGLANG_UNIT} was left as it was" in line
    assert f"SGLang generates {SGLANG_UNIT}" not in operations_started(result.output)
    assert (main_pid(host), unit_sha(host)) == (pid, unit), "the service was touched"
    assert http_status(host) == 200
    record("bad flags", result="refused before restart", restarts=0)


def test_failed_readiness_restores_the_previous_unit_and_shows_the_journal(deployed_lab, pcie_host, tmp_path):
    host = pcie_host
    change = write_group_data(tmp_path, "all", (
        "profiles = copy.deepcopy(base['profiles'])\n"
        "profiles['kimi_k26_dflash']['speculative']['num_draft_tokens'] = 6"))
    restored_at = {}

    def heal_when_restored():
        # The fault belongs to the new config: once the previous unit is back, health is fine again.
        wait_for(lambda: "num-draft-tokens 6" in fleet.ssh(host, f"cat {UNIT}"), 60, 0.5, "the new unit")
        wait_for(lambda: "num-draft-tokens 8" in fleet.ssh(host, f"cat {UNIT}"), 90, 0.3, "the restore")
        restored_at["t"] = time.monotonic()
        set_knobs(host)

    set_knobs(host, health_fail=True)
    healer = threading.Thread(target=heal_when_restored, daemon=True)
    try:
        healer.start()
        started = time.monotonic()
        result = run_deploy("--limit", host.name, "--data", "ready_timeout_s=20", group_data=change)
        finished = time.monotonic()
        healer.join(5)
    finally:
        set_knobs(host)
    assert result.returncode != 0
    out = result.output
    assert f"{SGLANG_UNIT} did not generate within 20s" in out, out[-3000:]
    assert "restored the previous unit, which generates again" in out, out[-3000:]
    assert "Last lines of its journal" in out and "[lab stand-in sglang 0.5.23" in out  # the journal itself
    assert "--speculative-num-draft-tokens 8" in fleet.ssh(host, f"cat {UNIT}")
    assert fleet.ssh(host, f"ls {UNIT}.specfleet-previous 2>/dev/null || true") == ""
    assert server_info(host)["speculative_num_draft_tokens"] == 8 and http_status(host) == 200
    record("failed readiness", result="rolled back", deploy_s=round(finished - started, 1),
           restore_to_serving_s=round(finished - restored_at["t"], 1))
    again = run_deploy("--limit", host.name)
    assert again.returncode == 0, again.output[-3000:]


@pytest.mark.parametrize("victim", ["server", "launcher"])
def test_killed_server_is_restarted_by_systemd(deployed_lab, b200_host, victim):
    host = b200_host
    launcher = main_pid(host).split()[0]  # the pid (main_pid also gives the start time)
    target = fleet.ssh(host, f"pgrep -P {launcher}").split()[0] if victim == "server" else launcher
    restarts = int(fleet.ssh(host, f"systemctl show -p NRestarts --value {SGLANG_UNIT}"))
    restart_sec = float(fleet.ssh(host, f"systemctl show -p RestartUSec --value {SGLANG_UNIT}").strip().rstrip("s"))
    killed = time.monotonic()
    # The kill and the restart by the host's own clock: systemd's start of the new main process is what the
    # unit promises (its RestartSec); the stand-in's start after it is the machine's load.
    killed_at = float(fleet.ssh(host, f"date -u +%s.%N; kill -9 {target}").split()[0])
    wait_for(lambda: http_status(host) != 200, 10, 0.1, "the server to go down")
    wait_for(lambda: http_status(host) == 200, 60, 0.2, "/health_generate to answer again")
    recovered = time.monotonic() - killed
    assert int(fleet.ssh(host, f"systemctl show -p NRestarts --value {SGLANG_UNIT}")) == restarts + 1
    assert main_pid(host).split()[0] != launcher
    assert server_info(host)["speculative_algorithm"] == "DFLASH"
    started = fleet.ssh(host, f"systemctl show --timestamp=us+utc -p ExecMainStartTimestamp --value {SGLANG_UNIT}")
    restarted_after = datetime.strptime(started.strip(), "%a %Y-%m-%d %H:%M:%S.%f %Z").replace(
        tzinfo=timezone.utc).timestamp() - killed_at
    # RestartSec, then systemd's start: a few seconds of slack for a loaded machine's scheduling.
    assert restart_sec <= restarted_after < restart_sec + 5, f"restarted {restarted_after:.1f} s after the kill"
    record(f"server crash (kill -9 {victim})", result="restarted by systemd",
           recovered_s=round(recovered, 1), restarted_after_s=round(restarted_after, 1), restart_sec=restart_sec)


def test_crash_looping_server_fails_readiness_within_a_minute_and_is_rolled_back(deployed_lab, pcie_host, tmp_path):
    """The new config's server never answers health and dies a second after every start (its own knobs
    file); ready_timeout_s is 10 min."""
    host, crash_knobs = pcie_host, "/etc/specfleet-lab/crash-loop.json"
    change = write_group_data(tmp_path, "all", (
        "profiles = copy.deepcopy(base['profiles'])\n"
        "profiles['kimi_k26_dflash']['speculative']['num_draft_tokens'] = 6\n"
        f"profiles['kimi_k26_dflash']['env'] = {{'SPECFLEET_SGLANG_KNOBS': {crash_knobs!r}}}"))
    times = {}

    def time_the_rollback():
        wait_for(lambda: "num-draft-tokens 6" in fleet.ssh(host, f"cat {UNIT}"), 90, 0.3, "the new unit")
        times["new"] = time.monotonic()
        wait_for(lambda: "num-draft-tokens 8" in fleet.ssh(host, f"cat {UNIT}"), 150, 0.3, "the restore")
        times["restored"] = time.monotonic()

    fleet.ssh(host, f"echo '{{\"exit_after_s\": 1, \"health_fail\": true}}' > {crash_knobs}")
    timer = threading.Thread(target=time_the_rollback, daemon=True)
    try:
        timer.start()
        result = run_deploy("--limit", host.name, "--data", "ready_timeout_s=600", group_data=change, timeout=180)
        timer.join(5)
    finally:
        fleet.ssh(host, f"rm -f {crash_knobs}")
    detected = times["restored"] - times["new"]
    out = result.output
    assert result.returncode != 0
    assert f"{SGLANG_UNIT} crash-loops: the server died 3 times since the restart" in out, out[-3000:]
    assert "restored the previous unit, which generates again" in out, out[-3000:]
    assert "Last lines of its journal" in out and "lab stand-in fault: exit_after_s" in out  # the journal itself
    assert detected < 60, f"the crash loop was rolled back {detected:.0f}s after the new unit"
    assert "--speculative-num-draft-tokens 8" in fleet.ssh(host, f"cat {UNIT}")
    assert server_info(host)["speculative_num_draft_tokens"] == 8 and http_status(host) == 200
    record("crash loop", result="failed readiness and rolled back", new_unit_to_rollback_s=round(detected, 1))
    again = run_deploy("--limit", host.name)
    assert again.returncode == 0, again.output[-3000:]


LONG_TOKENS = 14000  # ~100 s at the stand-in's pace (speed_model: 3.45 tokens a 25 ms DFlash step)


def test_a_restart_lets_a_generation_longer_than_systemds_default_stop_timeout_finish(deployed_lab, pcie_host):
    """No gateway, no drain: the unit alone. KillMode=mixed sends the restart's SIGTERM to SGLang's main
    process, which finishes the generation and then stops its schedulers; TimeoutStopSec (from
    longest_generation_s) outlasts systemd's default 90 s, which killed it."""
    host, answer = pcie_host, {}
    ask = json.dumps({"model": "kimi-k2.6", "max_tokens": LONG_TOKENS, **NO_THINKING,  # all of it content
                      "messages": [{"role": "user", "content": "a long answer"}]})

    def generate():
        started = time.monotonic()
        answer["text"] = fleet.ssh(host, "k=$(cat /etc/specfleet/api-key 2>/dev/null); curl -s -m 300 -w '\\n%{http_code}' "
                                         "${k:+-H \"Authorization: Bearer $k\"} -H 'Content-Type: application/json' "
                                         f"localhost:30000/v1/chat/completions -d '{ask}'", check=False, timeout=320)
        answer["seconds"] = time.monotonic() - started

    since = fleet.ssh(host, "date +%s").strip()
    generation = threading.Thread(target=generate, daemon=True)
    generation.start()
    time.sleep(3)  # generating
    started = time.monotonic()
    fleet.ssh(host, f"systemctl restart {SGLANG_UNIT}", timeout=300)  # returns once the old server stopped and the new one started
    restart_s = time.monotonic() - started
    generation.join(320)
    body, status = answer["text"].rsplit("\n", 1)
    journal = fleet.ssh(host, f"journalctl -u {SGLANG_UNIT} --since @{since} -o cat --no-pager")
    assert status == "200", answer["text"][-500:]
    assert len(json.loads(body)["choices"][0]["message"]["content"].split()) == LONG_TOKENS
    assert restart_s > 90 and "Remaining number of requests 1" in journal, journal[-2000:]
    assert "crashed" not in journal and "Killing" not in journal, journal[-2000:]
    wait_for(lambda: http_status(host) == 200, 60, 0.5, "the restarted server to generate")
    record("restart during a long generation", result="finished", tokens=LONG_TOKENS,
           generation_s=round(answer["seconds"], 1), restart_s=round(restart_s, 1))
