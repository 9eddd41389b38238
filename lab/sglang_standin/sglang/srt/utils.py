"""LAB STAND-IN helpers for the stand-in's processes, after SGLang 0.5.23's srt/utils/common.py
and srt/utils/watchdog.py (paths inside the 0.5.23 wheel), plus the lab's fault knobs."""

import ctypes
import json
import os
import queue
import signal
import sys
import threading
import time
from pathlib import Path

# lab/config.py SGLANG_KNOBS_FILE; the stand-in runs on hosts without lab/.
KNOBS_FILE = "/etc/specfleet-lab/sglang-standin.json"
PR_SET_PDEATHSIG = 1
PR_SET_NAME = 15


def read_knobs() -> dict:
    """The lab's fault knobs (SPECFLEET_SGLANG_KNOBS, else KNOBS_FILE); none when the file is absent."""
    path = os.environ.get("SPECFLEET_SGLANG_KNOBS", KNOBS_FILE)
    try:
        return json.loads(Path(path).read_text())
    except FileNotFoundError:
        return {}


class CachedKnobs:
    """read_knobs() at most every `ttl_s`: the scheduler asks once per batch."""

    def __init__(self, ttl_s: float = 0.5):
        self.ttl_s, self.read_at, self.values = ttl_s, -1e9, {}

    def get(self, name: str, default=None):
        if time.monotonic() - self.read_at > self.ttl_s:
            try:
                self.values = read_knobs()
            except ValueError:  # a file being rewritten: keep the last values
                pass
            self.read_at = time.monotonic()
        return self.values.get(name, default)


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def kill_itself_when_parent_died() -> None:
    """common.py:3432-3437: prctl(PR_SET_PDEATHSIG, SIGKILL), called first by the scheduler,
    detokenizer and DP controller processes."""
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def set_process_title(title: str) -> None:
    """The real one calls setproctitle (scheduler.py:6294, detokenizer_manager.py:551); the stand-in
    has no setproctitle and names only the kernel's comm, which keeps the first 15 bytes."""
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_NAME, title.encode()[:15], 0, 0, 0)


def children_of(pid: int) -> list[int]:
    """Every descendant of `pid`, read from /proc (psutil's children(recursive=True))."""
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat[stat.rindex(")") + 2:].split()[1])
        parents.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        for child in parents.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def kill_process_tree(parent_pid: int, include_parent: bool = True) -> None:
    """common.py:2507-2564: SIGKILL every descendant, then the parent itself (for this process:
    SIGKILL to itself, so it dies of SIGKILL)."""
    log(f"kill_process_tree called: parent_pid={parent_pid}, include_parent={include_parent}, pid={os.getpid()}")
    for child in children_of(parent_pid):
        try:
            os.kill(child, signal.SIGKILL)
        except ProcessLookupError:
            pass
    if include_parent:
        os.kill(parent_pid, signal.SIGKILL)
        if parent_pid == os.getpid():
            time.sleep(60)  # SIGKILL is on its way


class SubprocessWatchdog:
    """watchdog.py:166-222: polls the children every second; one dead with a non-zero exit code
    (-15 and -9 included) makes the main process send itself SIGQUIT."""

    def __init__(self, processes, names, interval: float = 1.0):
        self.processes, self.names, self.interval = processes, names, interval
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True, name="subprocess-watchdog")

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.stopped.set()

    def _loop(self) -> None:
        while not self.stopped.wait(self.interval):
            for process, name in zip(self.processes, self.names):
                if process.is_alive() or process.exitcode == 0:
                    continue
                log(f"Subprocess {name} (pid={process.pid}) crashed with exit code {process.exitcode}. "
                    "Triggering SIGQUIT for cleanup...")
                os.kill(os.getpid(), signal.SIGQUIT)
                return


class SignalLoop:
    """Runs signal handlers on a thread of their own, as SGLang's run in its event loop
    (loop.add_signal_handler, tokenizer_manager.py:2440-2462: called without arguments). The
    handler Python runs on the main thread only queues the signal (SimpleQueue.put is reentrant),
    so a signal that arrives twice at once, as SIGTERM does from systemd and from the unit's
    launcher, runs its handler twice in turn instead of inside itself."""

    def __init__(self):
        self.queue: queue.SimpleQueue = queue.SimpleQueue()
        threading.Thread(target=self._run, daemon=True, name="signal-loop").start()

    def add(self, signum: int, handler) -> None:
        signal.signal(signum, lambda number, frame: self.post(handler, number))

    def post(self, handler, signum: int) -> None:
        self.queue.put((handler, signum))

    def _run(self) -> None:
        while True:
            handler, signum = self.queue.get()
            handler(signum)


def hang() -> None:
    """Wait forever, as a rank blocked on a peer that is gone (NCCL, ZMQ) does: its parent's
    watchdog or PR_SET_PDEATHSIG ends it."""
    threading.Event().wait()
