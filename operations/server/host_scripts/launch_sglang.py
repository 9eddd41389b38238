"""Runs ON THE HOST as the SGLang unit's ExecStart: `python -m sglang.launch_server` plus its keys.

The API key (the clients', SPECFLEET_API_KEY_FILE) and the host's worker admin key
(SPECFLEET_ADMIN_API_KEY_FILE: with it, SGLang's admin-optional routes such as
/update_weights_from_disk take it alone and refuse the clients' key, utils/auth.py)
are read from their files and added to the server's argv inside the process (as
`--api-key=KEY`, `--admin-api-key=KEY`, so a key starting with `-` is never read as a
flag), so neither is in the unit file or in `ps` (the kernel keeps the exec-time argv).
SGLang logs its resolved ServerArgs, both keys included, so the server (and every
process it spawns) writes into a pipe that this process copies to the journal with
the keys masked: raw, and in the escaped forms a log line can carry (repr, JSON,
URL-encoded).

The server dies with this process (PR_SET_PDEATHSIG): a launcher killed with
SIGKILL must not leave its server holding the port, or every restart systemd
makes fails with "Address already in use" where the unit's cgroup cannot be
killed (containers with a partial cgroup setup).
"""

import ctypes
import json
import os
import re
import runpy
import signal
import sys
import urllib.parse
from pathlib import Path

PR_SET_PDEATHSIG = 1
MASK = b"***"
LONE_CR = re.compile(rb"\r(?!\n)")  # a progress bar's redraw (tqdm): a line of its own in the journal


def read_key(key_file: str) -> str:
    path = Path(key_file)
    return path.read_text().strip() if path.is_file() else ""


def server_argv(args: list[str], key: str, admin_key: str = "") -> list[str]:
    return ["sglang.launch_server", *args, *([f"--api-key={key}"] if key else []),
            *([f"--admin-api-key={admin_key}"] if admin_key else [])]


def key_forms(*keys: str) -> list[bytes]:
    """The keys as a log line can print them, longest first (so no form is left half-masked)."""
    forms = {form for key in keys if key for form in (
        key, repr(key)[1:-1], json.dumps(key)[1:-1], json.dumps(key)[1:-1].replace("/", "\\/"),
        urllib.parse.quote(key, safe=""), urllib.parse.quote_plus(key, safe=""))}
    return sorted((form.encode() for form in forms), key=len, reverse=True)


def masked(line: bytes, forms: list[bytes]) -> bytes:
    for form in forms:
        line = line.replace(form, MASK)
    return line


def main() -> None:
    key = read_key(os.environ.get("SPECFLEET_API_KEY_FILE", "/nonexistent"))
    admin_key = read_key(os.environ.get("SPECFLEET_ADMIN_API_KEY_FILE", "/nonexistent"))
    argv = server_argv(sys.argv[1:], key, admin_key)
    read_end, write_end = os.pipe()
    launcher = os.getpid()
    server = os.fork()
    if server == 0:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != launcher:  # the launcher died before prctl took effect
            os._exit(1)
        os.close(read_end)
        os.dup2(write_end, 1)
        os.dup2(write_end, 2)
        sys.argv = argv
        runpy.run_module("sglang.launch_server", run_name="__main__", alter_sys=True)
        sys.exit(0)

    os.close(write_end)
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda number, _frame: os.kill(server, number))
    forms = key_forms(key, admin_key)
    with os.fdopen(read_end, "rb") as server_output:
        for line in server_output:
            sys.stdout.buffer.write(LONE_CR.sub(b"\n", masked(line, forms)))
            sys.stdout.flush()
    _, status = os.waitpid(server, 0)
    if os.WIFSIGNALED(status):
        # Die of the server's signal, so systemd sees what happened: SIGTERM from `systemctl stop`
        # is a clean stop, SIGKILL or SIGSEGV a crash to restart from. SIGKILL (how SGLang's own
        # watchdog ends its main process) and SIGSTOP take no handler: signal.signal refuses them
        # (EINVAL), and their default action is the only one they have.
        number = os.WTERMSIG(status)
        if number not in (signal.SIGKILL, signal.SIGSTOP):
            signal.signal(number, signal.SIG_DFL)
        os.kill(os.getpid(), number)
    sys.exit(os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 1)


if __name__ == "__main__":
    main()
