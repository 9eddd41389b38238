"""The host scripts as plain Python: the launcher's key handling and the probe's socket-owner check."""

import importlib.util
import json
import socket
import subprocess
import sys
import urllib.parse
from pathlib import Path

import pytest

from operations.basics.host_programs import HOST_SCRIPTS, _imported
from tests.sglang_real import RealSGLangRejected, parse_with_real_sglang


def load(name: str):
    """A host program as a module, with the host programs it imports by name (as on the host)."""
    spec = importlib.util.spec_from_file_location(name, HOST_SCRIPTS[name])
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    for dependency in _imported(HOST_SCRIPTS[name].read_text()):
        if dependency not in sys.modules:
            load(dependency)
    spec.loader.exec_module(module)
    return module


launcher, probe, owned = load("launch_sglang"), load("probe_server"), load("owned_sockets")
DASH_KEY = "-starts-with-a-dash-0123"


def test_a_key_starting_with_a_dash_reaches_the_real_parser_as_the_key():
    argv = launcher.server_argv(["--model-path", "/srv/m"], DASH_KEY)
    assert argv == ["sglang.launch_server", "--model-path", "/srv/m", f"--api-key={DASH_KEY}"]
    assert parse_with_real_sglang(argv[1:])["api_key"] == DASH_KEY
    with pytest.raises(RealSGLangRejected):  # what `--api-key KEY` did
        parse_with_real_sglang(["--model-path", "/srv/m", "--api-key", DASH_KEY])
    assert launcher.server_argv(["--port", "1"], "") == ["sglang.launch_server", "--port", "1"]


def test_the_launcher_gives_sglang_the_worker_admin_key_in_process_and_masks_both_keys(tmp_path):
    """SGLang parses the host's worker admin key as --admin-api-key; a server printing its argv (as SGLang
    logs its ServerArgs) reaches the journal with neither key in it."""
    admin = "worker-admin-0123456789abcdef"
    argv = launcher.server_argv(["--model-path", "/srv/m"], DASH_KEY, admin)
    parsed = parse_with_real_sglang(argv[1:])
    assert (parsed["api_key"], parsed["admin_api_key"]) == (DASH_KEY, admin)
    package = tmp_path / "sglang"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "launch_server.py").write_text("import sys\nprint(sys.argv[1:], flush=True)\n")
    (tmp_path / "api-key").write_text(DASH_KEY + "\n")
    (tmp_path / "admin-api-key").write_text(admin)
    run = subprocess.run([sys.executable, str(HOST_SCRIPTS["launch_sglang"]), "--port", "1"], capture_output=True,
                         text=True, timeout=30, env={"PYTHONPATH": str(tmp_path),
                                                     "SPECFLEET_API_KEY_FILE": str(tmp_path / "api-key"),
                                                     "SPECFLEET_ADMIN_API_KEY_FILE": str(tmp_path / "admin-api-key")})
    assert run.stdout == "['--port', '1', '--api-key=***', '--admin-api-key=***']\n"


@pytest.mark.parametrize("key", ["abcdef0123456789abcdef", "aGVsbG8/d29y+bGQ=", DASH_KEY])
def test_every_form_a_log_line_can_print_the_key_in_is_masked(key):
    forms = launcher.key_forms(key)
    lines = [f"ServerArgs(api_key={key!r}, port=30000)", json.dumps({"api_key": key}),
             json.dumps({"api_key": key}).replace("/", "\\/"), f"GET /v1?key={urllib.parse.quote(key, safe='')}",
             f"form: {urllib.parse.quote_plus(key)}", f"raw {key} twice {key}"]
    for line in lines:
        masked = launcher.masked(line.encode(), forms)
        assert key.encode() not in masked and urllib.parse.quote(key, safe="").encode() not in masked, masked
        assert b"***" in masked
    assert launcher.key_forms("") == []


def test_the_launcher_reads_the_key_file_or_none(tmp_path):
    (tmp_path / "api-key").write_text("k" * 20 + "\n")
    assert launcher.read_key(str(tmp_path / "api-key")) == "k" * 20
    assert launcher.read_key(str(tmp_path / "absent")) == ""


def tcp_table(path: Path, rows: list[tuple]) -> str:
    """A /proc/net/tcp in the kernel's format: (local, remote, uid[, state: ESTABLISHED unless given])."""
    head = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
    body = "".join(f"   {i}: {local} {remote} {state[0] if state else '01'} 00000000:00000000 00:00000000 00000000  "
                   f"{uid:>5}        0 {1000 + i} 1\n" for i, (local, remote, uid, *state) in enumerate(rows))
    path.write_text(head + body)
    return str(path)


def test_socket_owners_reads_both_ends_of_a_connection(tmp_path):
    # 127.0.0.1:30000 (0x7530) listening as uid 998, and one connection to it from port 0xC350 (50000).
    table = tcp_table(tmp_path / "tcp", [("0100007F:7530", "00000000:0000", 998),
                                         ("0100007F:7530", "0100007F:C350", 998),
                                         ("0100007F:C350", "0100007F:7530", 0)])
    owners = owned.socket_owners((table, str(tmp_path / "no-tcp6")))
    assert owners[(30000, 50000)] == 998 and owners[(50000, 30000)] == 0 and owners[(30000, 0)] == 998


def test_a_closed_connection_on_the_same_ports_is_not_the_new_ones_owner(tmp_path):
    """A busy gateway's host: an earlier client's connection from another address, closed by the server, lingers
    in TIME_WAIT (06) under uid 0 with the very ports of a new loopback connection, listed after it."""
    table = tcp_table(tmp_path / "tcp", [("0100007F:7590", "00000000:0000", 999, "0A"),
                                         ("0100007F:7590", "0100007F:C350", 999),
                                         ("0A0D0C0A:7590", "010D0C0A:C350", 0, "06")])
    assert owned.socket_owners((table, str(tmp_path / "no-tcp6")))[(30096, 50000)] == 999


def test_the_probe_refuses_a_server_another_uid_owns():
    """A real loopback listener of this test's own uid: the probe expecting another uid sends nothing."""
    import os
    import threading

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    received = []

    def accept():
        connection, _ = listener.accept()
        connection.settimeout(2)
        try:
            received.append(connection.recv(4096))
        except OSError:
            pass
        connection.close()

    threading.Thread(target=accept, daemon=True).start()
    port = listener.getsockname()[1]
    with pytest.raises(PermissionError, match="the API key was not sent"):
        probe.call(port, os.getuid() + 1, "/health_generate", {"Authorization": "Bearer secret-key"})
    listener.close()
    assert not any(b"secret-key" in data for data in received)


def test_a_progress_bars_redraws_become_journal_lines():
    bar = b"Loading safetensors checkpoint shards:  50% | 1/2\rLoading safetensors checkpoint shards: 100% | 2/2\r\n"
    assert launcher.LONE_CR.sub(b"\n", bar) == (b"Loading safetensors checkpoint shards:  50% | 1/2\n"
                                                b"Loading safetensors checkpoint shards: 100% | 2/2\r\n")


@pytest.mark.parametrize("end, status", [
    ("os.kill(os.getpid(), signal.SIGKILL)", -9),  # how SGLang's watchdog ends its main process
    ("os.kill(os.getpid(), signal.SIGTERM)", -15),
    ("sys.exit(3)", 3),
])
def test_the_launcher_ends_as_its_server_did(tmp_path, end, status):
    """systemd reads the launcher's end: a server killed by a signal must leave the launcher killed by it."""
    package = tmp_path / "sglang"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "launch_server.py").write_text(f"import os, signal, sys\nprint('serving', flush=True)\n{end}\n")
    run = subprocess.run([sys.executable, str(HOST_SCRIPTS["launch_sglang"])], capture_output=True, text=True,
                         timeout=30, env={"PYTHONPATH": str(tmp_path), "SPECFLEET_API_KEY_FILE": "/nonexistent"})
    assert (run.returncode, run.stdout, run.stderr) == (status, "serving\n", "")


class LoopbackServer:
    """An HTTP server on 127.0.0.1 in a thread of its own, for a host program to talk to."""

    def serve(self, handler) -> None:
        import threading
        from http.server import ThreadingHTTPServer
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


class Recorder(LoopbackServer):
    """A loopback HTTP server answering every request with `answer(path) -> (status, headers, body)` and
    recording each request's path and Authorization header."""

    def __init__(self, answer):
        from http.server import BaseHTTPRequestHandler
        seen, bodies = self.seen, self.bodies = [], []

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                seen.append((self.command, self.path, self.headers.get("Authorization")))
                bodies.append(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
                status, headers, body = answer(self.path)
                self.send_response(status)
                for name, value in headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_POST = do_DELETE = do_GET

            def log_message(self, *args):
                pass

        self.serve(Handler)


gateway_workers = load("gateway_workers")


CHAT = json.dumps({"choices": [{"message": {"content": "Drafts verified."}}], "usage": {"completion_tokens": 3}})
SERVER_INFO = json.dumps({"speculative_algorithm": "DFLASH", "speculative_num_draft_tokens": 8,
                          "internal_states": [{"avg_spec_accept_length": 3.5}], "max_total_num_tokens": 222016})


def probed(statuses: dict[str, int], bodies: list | None = None) -> tuple[dict, list[str]]:
    """A probe of a server answering `statuses` (path -> status; 200 where not given, with a completion and
    server_info), as this test's own user: the result and the paths it asked (their bodies in `bodies`)."""
    import getpass
    import os

    def answer(path):
        body = {"/v1/chat/completions": CHAT, "/server_info": SERVER_INFO}.get(path, "")
        return statuses.get(path, 200), {}, body.encode()

    server = Recorder(answer)
    try:
        result = probe.probe(str(server.port), "m", os.devnull + "-absent", getpass.getuser())
    finally:
        server.close()
    if bodies is not None:
        bodies += server.bodies
    return result, [path for _, path, _ in server.seen]


def test_the_probe_of_a_ready_server_waits_for_no_health_generation():
    """/ready answers at once; /health_generate (0.5.23: an asyncio.sleep(1) before its first check) would
    hold every no-op's host program for a second: a ready server is not asked it."""
    result, asked = probed({})
    assert asked == ["/ready", "/v1/chat/completions", "/server_info"]
    assert result == {"ready": True, "generated": True, "completion": "Drafts verified.", "algorithm": "DFLASH",
                      "num_draft_tokens": 8, "accept_length": 3.5, "max_total_num_tokens": 222016}


def test_the_probe_asks_a_completion_of_eight_tokens():
    """Eight tokens prove the engine generates; each decode step is on every no-op's path (the lab's engine,
    at DFlash's accept length: 0.29 s for 32 tokens of a 0.45 s host program)."""
    bodies: list = []
    result, asked = probed({}, bodies)
    chat = json.loads(bodies[asked.index("/v1/chat/completions")])
    assert chat["max_tokens"] == 8 and result["generated"]


def test_a_server_ready_refuses_is_asked_the_health_check_that_can_mark_it_up_again():
    """SGLang marks a server unhealthy after a failed health check, and /ready refuses it until a health check
    generates; a server without /ready (before 0.5.20) answers 404."""
    for refused in (503, 404):
        result, asked = probed({"/ready": refused})
        assert asked == ["/ready", "/health_generate", "/v1/chat/completions", "/server_info"]
        assert result["ready"] and result["generated"]
    result, asked = probed({"/ready": 503, "/health_generate": 503})
    assert asked == ["/ready", "/health_generate"]
    assert result == {"ready": False, "error": "HTTP Error 503: Service Unavailable (/health_generate)"}


def test_the_gateway_client_never_follows_a_redirect_with_the_admin_key():
    elsewhere = Recorder(lambda path: (200, {}, b'{"workers": []}'))
    redirecting = Recorder(lambda path: (307, {"Location": f"http://127.0.0.1:{elsewhere.port}{path}"}, b""))
    try:
        gateway = gateway_workers.Gateway("127.0.0.1", redirecting.port, "admin-secret", None)
        with pytest.raises(OSError, match="a redirect, not followed"):
            gateway.call("GET", "/workers")
        assert redirecting.seen == [("GET", "/workers", "Bearer admin-secret")] and elsewhere.seen == []
    finally:
        redirecting.close()
        elsewhere.close()


def test_the_gateway_client_sends_no_key_to_a_local_port_another_user_listens_on():
    import os
    listener = Recorder(lambda path: (200, {}, b'{"workers": []}'))
    try:
        someone_else = gateway_workers.Gateway("127.0.0.1", listener.port, "admin-secret", os.getuid() + 1)
        with pytest.raises(PermissionError, match="not the gateway's uid .*: the API key was not sent"):
            someone_else.call("GET", "/workers")
        ours = gateway_workers.Gateway("127.0.0.1", listener.port, "admin-secret", os.getuid())
        assert ours.call("GET", "/workers") == (200, {"workers": []})
        assert listener.seen == [("GET", "/workers", "Bearer admin-secret")]  # the second call only
        # A gateway not yet installed (no such user) is unreachable, and gets no key either.
        listed = gateway_workers.list_workers(gateway_workers.Gateway("127.0.0.1", listener.port, "k", -1), "m")
        assert listed["reachable"] is False and len(listener.seen) == 1
    finally:
        listener.close()


def test_the_benchmarks_server_request_sends_the_key_only_to_the_service_users_port_and_follows_no_redirect(tmp_path):
    import os
    import pwd
    server_request = load("server_request")
    me = pwd.getpwuid(os.getuid()).pw_name
    key_file = tmp_path / "api-key"
    key_file.write_text("server-secret\n")
    elsewhere = Recorder(lambda path: (200, {}, b"{}"))
    server = Recorder(lambda path: (307, {"Location": f"http://127.0.0.1:{elsewhere.port}/"}, b"")
                      if path == "/moved" else (200, {}, b'{"version": "0.5.23"}'))
    try:
        assert server_request.request(server.port, "/server_info", "GET", me, str(key_file)) == '{"version": "0.5.23"}'
        assert server_request.request(server.port, "/flush_cache", "POST", me) == '{"version": "0.5.23"}'
        assert server.seen == [("GET", "/server_info", "Bearer server-secret"), ("POST", "/flush_cache", None)]
        with pytest.raises(OSError, match="HTTP 307"):
            server_request.request(server.port, "/moved", "GET", me, str(key_file))
        assert elsewhere.seen == []
        someone_else = pwd.getpwuid(0).pw_name if os.getuid() != 0 else "nobody"
        with pytest.raises(PermissionError, match="the API key was not sent"):
            server_request.request(server.port, "/server_info", "GET", someone_else, str(key_file))
        assert len(server.seen) == 3
    finally:
        server.close()
        elsewhere.close()


# /metrics as SGLang 0.5.23 writes the in-flight gauges (metrics_collector.py labels; http_request_metrics.py):
# two running, one queued, one chat completion not answered yet, and the scrape itself.
BUSY = """# HELP sglang:num_running_reqs The number of running requests.
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{model_name="kimi-k2.6",engine_type="unified",tp_rank="0",pp_rank="0",moe_ep_rank="0"} 2.0
sglang:num_queue_reqs{model_name="kimi-k2.6",engine_type="unified",tp_rank="0",pp_rank="0",moe_ep_rank="0"} 1.0
sglang:num_grammar_queue_reqs{model_name="kimi-k2.6",engine_type="unified",tp_rank="0",pp_rank="0",moe_ep_rank="0"} 0.0
sglang:http_requests_active{endpoint="/v1/chat/completions",method="POST"} 1.0
sglang:http_requests_active{endpoint="/metrics",method="GET"} 1.0
sglang:spec_accept_length{model_name="kimi-k2.6"} 3.45
"""
IDLE = "\n".join(line for line in BUSY.splitlines() if "chat" not in line).replace(" 2.0", " 0.0").replace(" 1.0\n", " 0.0\n")


def test_requests_in_flight_are_the_schedulers_and_the_unanswered_ones_not_the_scrape():
    assert gateway_workers.in_flight(BUSY) == 4
    assert gateway_workers.in_flight(IDLE + "\n") == 0


def test_the_drain_waits_until_the_server_reads_idle_three_times_and_gives_up_at_its_bound():
    answers = iter([BUSY, IDLE, BUSY, IDLE, IDLE, IDLE])
    server = Recorder(lambda path: (200, {}, next(answers, IDLE).encode()))
    try:
        waited = gateway_workers.wait_idle(f"http://127.0.0.1:{server.port}", 30)
        assert waited["in_flight"] == 0 and 5 <= waited["idle_s"] < 10  # six reads a second apart
        assert {path for _, path, key in server.seen} == {"/metrics"} and {key for *_, key in server.seen} == {None}
        busy = Recorder(lambda path: (200, {}, BUSY.encode()))
        try:
            assert gateway_workers.wait_idle(f"http://127.0.0.1:{busy.port}", 2)["in_flight"] == 4
        finally:
            busy.close()
    finally:
        server.close()
    # A stopped server holds nothing.
    assert gateway_workers.server_in_flight(f"http://127.0.0.1:{server.port}") == 0


class FakeSmg(LoopbackServer):
    """smg's /workers as 1.13.0 answers it (GET lists {"id", "url", "status", "model_id"}, POST adds a worker
    that turns `ready`, DELETE takes it away), with one worker its health checks gave up on: `failed`."""

    def __init__(self, failed_url: str, model: str):
        from http.server import BaseHTTPRequestHandler
        workers = self.workers = {"w0": {"id": "w0", "url": failed_url, "status": "failed", "model_id": model}}
        seen = self.seen = []

        class Handler(BaseHTTPRequestHandler):
            def answer(self, body: dict, status: int = 200):
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                self.answer({"workers": list(workers.values())})

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                seen.append(("POST", body["url"]))
                if any(w["url"] == body["url"] for w in workers.values()):
                    return self.answer({"error": "worker already exists"}, 409)
                workers[f"w{len(seen)}"] = {"id": f"w{len(seen)}", "url": body["url"], "status": "ready",
                                            "model_id": model}
                self.answer({"status": "accepted"}, 202)

            def do_DELETE(self):
                seen.append(("DELETE", workers[self.path.rsplit("/", 1)[1]]["url"]))
                del workers[self.path.rsplit("/", 1)[1]]
                self.answer({"status": "accepted"}, 202)

            def log_message(self, *args):
                pass

        self.serve(Handler)


def test_the_sync_registers_again_a_worker_the_gateway_lists_as_failed():
    """smg newer than 1.13.0 keeps a worker that was down past its failure window `failed` until it is removed:
    the sync reads it as absent, removes it and registers it again, and ends with it `ready`."""
    url = "http://10.213.1.10:30000"
    smg = FakeSmg(url, "m")
    try:
        gateway = gateway_workers.Gateway("127.0.0.1", smg.port, "admin-secret", None)
        result = gateway_workers.sync(gateway, "m", 5, [url], [url], "")
        assert smg.seen == [("DELETE", url), ("POST", url)]
        assert result == {"added": [url], "removed": [], "again": [url]}
        assert [w["status"] for w in smg.workers.values()] == ["ready"]
    finally:
        smg.close()


def test_the_sync_removes_the_workers_of_other_models_but_none_of_a_failed_host():
    """A host switched to another model left its workers in the gateway of its old one: the sync removes
    them, before it registers a worker of the gateway's own model at the URL one of them held."""
    url, stray, failed = "http://10.213.1.10:30000", "http://10.213.1.11:30000", "http://10.213.1.12:30000"
    smg = FakeSmg(url, "m")
    smg.workers.update({"s1": {"id": "s1", "url": stray, "status": "ready", "model_id": "old"},
                        "s2": {"id": "s2", "url": url, "status": "ready", "model_id": "old"},
                        "s3": {"id": "s3", "url": failed, "status": "ready", "model_id": "old"},
                        "s4": {"id": "s4", "url": "http://10.213.1.13:30000", "status": "ready", "model_id": "other"}})
    try:
        gateway = gateway_workers.Gateway("127.0.0.1", smg.port, "admin-secret", None)
        result = gateway_workers.sync(gateway, "m", 5, [url], [url], "", alone=True, keep=["10.213.1.12"])
        assert result["removed"] == [f"{url} (old)", f"{stray} (old)", "http://10.213.1.13:30000 (other)"]
        assert sorted((w["url"], w["model_id"]) for w in smg.workers.values()) == [(url, "m"), (failed, "old")]
        # Not alone (a join), other models are left alone.
        smg.workers["s5"] = {"id": "s5", "url": stray, "status": "ready", "model_id": "old"}
        assert gateway_workers.sync(gateway, "m", 5, [url], None, "")["removed"] == []
    finally:
        smg.close()
