"""The host scripts as plain Python: the launcher's key handling and the probe's socket-owner check."""

import importlib.util
import json
import socket
import subprocess
import sys
import urllib.parse
from pathlib import Path

import pytest

from operations.basics.host_programs import HOST_SCRIPTS
from tests.sglang_real import RealSGLangRejected, parse_with_real_sglang


def load(name: str):
    spec = importlib.util.spec_from_file_location(name, HOST_SCRIPTS[name])
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


launcher, probe = load("launch_sglang"), load("probe_server")
DASH_KEY = "-starts-with-a-dash-0123"


def test_a_key_starting_with_a_dash_reaches_the_real_parser_as_the_key():
    argv = launcher.server_argv(["--model-path", "/srv/m"], DASH_KEY)
    assert argv == ["sglang.launch_server", "--model-path", "/srv/m", f"--api-key={DASH_KEY}"]
    assert parse_with_real_sglang(argv[1:])["api_key"] == DASH_KEY
    with pytest.raises(RealSGLangRejected):  # what `--api-key KEY` did
        parse_with_real_sglang(["--model-path", "/srv/m", "--api-key", DASH_KEY])
    assert launcher.server_argv(["--port", "1"], "") == ["sglang.launch_server", "--port", "1"]


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


def tcp_table(path: Path, rows: list[tuple[str, str, int]]) -> str:
    """A /proc/net/tcp in the kernel's format: (local, remote, uid)."""
    head = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
    body = "".join(f"   {i}: {local} {remote} 01 00000000:00000000 00:00000000 00000000  {uid:>5}        0 {1000 + i} 1\n"
                   for i, (local, remote, uid) in enumerate(rows))
    path.write_text(head + body)
    return str(path)


def test_socket_owners_reads_both_ends_of_a_connection(tmp_path):
    # 127.0.0.1:30000 (0x7530) listening as uid 998, and one connection to it from port 0xC350 (50000).
    table = tcp_table(tmp_path / "tcp", [("0100007F:7530", "00000000:0000", 998),
                                         ("0100007F:7530", "0100007F:C350", 998),
                                         ("0100007F:C350", "0100007F:7530", 0)])
    owners = probe.socket_owners((table, str(tmp_path / "no-tcp6")))
    assert owners[(30000, 50000)] == 998 and owners[(50000, 30000)] == 0 and owners[(30000, 0)] == 998


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
