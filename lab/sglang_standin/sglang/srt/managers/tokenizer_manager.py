"""LAB STAND-IN for SGLang 0.5.23's TokenizerManager (srt/managers/tokenizer_manager.py): the
main process's side of every request, its health probe, and its signals.

Requests: each is registered in `rid_to_state` and sent to the rank-0 scheduler; its text comes
back from the detokenizer. A request whose scheduler is gone waits (ZMQ gives no error), checking
every SGLANG_REQUEST_STATE_WAIT_TIMEOUT (4 s) whether its client left, which aborts it
(tokenizer_manager.py:1946-1975). Nothing else ends it: the SubprocessWatchdog kills the server.

/health and /health_generate (entrypoints/http_server.py:721-799): 503 while starting or shutting
down; otherwise a one-token probe through the scheduler, checked every 1 s, 200 as soon as any
output or acknowledgement arrived after it was sent (last_receive_tstamp, tokenizer_manager.py:
2465-2478), 503 after SGLANG_HEALTH_CHECK_TIMEOUT (default 20 s, read once at start,
http_server.py:218), which also marks the server UnHealthy until a probe succeeds.
SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION=0 makes /health (not /health_generate) a plain 200.

SIGTERM (tokenizer_manager.py:3508-3571, 4066-4070): `gracefully_exit` is set; health answers 503;
requests are still accepted. The sigterm_watchdog notices within 5 s, then every 5 s logs
`Gracefully exiting... Remaining number of requests N` until `rid_to_state` is empty, with no
time limit, then sends ShutdownReq to the schedulers, waits up to 15 s for them, SIGKILLs what is
left of its children and stops the HTTP server, which stops accepting and waits for the HTTP
requests still open (a request that arrived after the drain never gets an answer, so the
process then waits for its client to leave, or for SIGKILL), and exits 0. An UnHealthy server
or SGL_FORCE_SHUTDOWN skips the drain. These handlers exist from the first request on (the
warmup, tokenizer_manager.py:2440-2462); before it, SIGTERM kills the main process (its children
follow through PR_SET_PDEATHSIG).

SIGQUIT (engine.py:1971-1982, tokenizer_manager.py:4072-4081): kill the whole tree, this process
last, with SIGKILL. The SubprocessWatchdog sends it when a child died with a non-zero code.
"""

import os
import queue
import threading
import time
import uuid
from multiprocessing.connection import Connection, wait

from sglang.srt.utils import kill_process_tree, log

HEALTH_CHECK_TIMEOUT = int(os.getenv("SGLANG_HEALTH_CHECK_TIMEOUT", 20))
REQUEST_STATE_WAIT_TIMEOUT = int(os.getenv("SGLANG_REQUEST_STATE_WAIT_TIMEOUT", 4))
DRAIN_POLL_S = 5  # sigterm_watchdog's asyncio.sleep(5)
SCHEDULER_EXIT_TIMEOUT_S = 15  # _SCHEDULER_EXIT_TIMEOUT_SECS
HEALTH_CHECK_RID_PREFIX = "HEALTH_CHECK"


def env_bool(name: str, default: bool) -> bool:
    """environ.py EnvBool."""
    value = os.environ.get(name)
    if value is None:
        return default
    if value.lower() in ("true", "1", "yes", "y"):
        return True
    if value.lower() in ("false", "0", "no", "n"):
        return False
    raise ValueError(f'"{value}" is not a valid boolean value')


class ClientGone(Exception):
    pass


class TokenizerManager:
    STARTING, UP, UNHEALTHY = "Starting", "Up", "UnHealthy"

    def __init__(self, to_scheduler: Connection, receivers: list[Connection], schedulers):
        self.to_scheduler, self.receivers = to_scheduler, receivers
        self.schedulers = schedulers  # multiprocessing.Process objects
        self.rid_to_state: dict[str, queue.Queue] = {}
        self.lock = threading.Lock()
        self.send_lock = threading.Lock()
        self.gracefully_exit = False
        self.server_status = self.STARTING
        self.running_phase = False
        self.last_receive_tstamp = time.time()
        self.load: dict | None = None
        self.gauges = (0, 0)  # num_running_reqs, num_queue_reqs as last reported
        self.schedulers_ready = threading.Event()
        self.subprocess_watchdog = None
        self.stop_hook = None
        threading.Thread(target=self.handle_loop, daemon=True, name="handle_loop").start()

    # -- to and from the schedulers -------------------------------------------------------

    def send(self, message: tuple) -> None:
        with self.send_lock:
            try:
                self.to_scheduler.send(message)
            except OSError:  # ZMQ queues for a peer that is gone, without an error
                pass

    def handle_loop(self) -> None:
        live = list(self.receivers)
        while live:
            for link in wait(live):
                try:
                    message = link.recv()
                except (EOFError, OSError):
                    live.remove(link)
                    continue
                kind = message[0]
                if kind == "out":
                    for rid, text, done, finished in message[1]:
                        with self.lock:
                            state = self.rid_to_state.pop(rid, None) if finished else self.rid_to_state.get(rid)
                        if state is not None:
                            state.put((text, done, finished))
                    self.last_receive_tstamp = time.time()
                elif kind == "health_ack":
                    self.last_receive_tstamp = time.time()
                elif kind == "loads":
                    self.load = message[1]
                    if message[2]:
                        self.gauges = (message[1]["num_running_reqs"], message[1]["num_waiting_reqs"])
                elif kind == "ready":
                    self.schedulers_ready.set()

    def generate(self, prompt: str, max_new_tokens: int, prompt_tokens: int, client_gone=None):
        """Yield (text, tokens so far, finished) as the detokenizer sends them."""
        rid = uuid.uuid4().hex
        state: queue.Queue = queue.Queue()
        with self.lock:
            self.rid_to_state[rid] = state
        self.send(("generate", rid, prompt, max(1, max_new_tokens), prompt_tokens))
        finished = False
        while not finished:
            try:
                text, done, finished = state.get(timeout=REQUEST_STATE_WAIT_TIMEOUT if client_gone else None)
            except queue.Empty:
                if client_gone():
                    self.abort(rid)
                    raise ClientGone(f"Request is disconnected from the client side (type 1). Abort request {rid=}")
                continue
            yield text, done, finished

    def abort(self, rid: str) -> None:
        with self.lock:
            self.rid_to_state.pop(rid, None)
        self.send(("abort", rid))

    # -- health -----------------------------------------------------------------------------

    def is_ready(self) -> bool:
        return not self.gracefully_exit and self.server_status == self.UP

    def health_generate(self, path: str) -> int:
        if self.gracefully_exit:
            log("Health check request received during shutdown. Returning 503.")
            return 503
        if self.server_status == self.STARTING:
            return 503
        if path == "/health" and not env_bool("SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION", True):
            return 200
        rid = f"{HEALTH_CHECK_RID_PREFIX}_{uuid.uuid4().hex}"
        with self.lock:
            self.rid_to_state[rid] = queue.Queue()
        self.send(("health", rid))
        tic = time.time()
        while time.time() < tic + HEALTH_CHECK_TIMEOUT:
            time.sleep(1)
            if self.last_receive_tstamp > tic:
                with self.lock:
                    self.rid_to_state.pop(rid, None)
                self.server_status = self.UP
                return 200
        log(f"Health check failed. Server couldn't get a response from detokenizer for last "
            f"{HEALTH_CHECK_TIMEOUT} seconds. tic start time: {time.strftime('%H:%M:%S', time.localtime(tic))}. "
            f"last_heartbeat time: {time.strftime('%H:%M:%S', time.localtime(self.last_receive_tstamp))}")
        with self.lock:
            self.rid_to_state.pop(rid, None)
        self.server_status = self.UNHEALTHY
        return 503

    # -- signals and the drain --------------------------------------------------------------

    def start_running_phase(self) -> None:
        """auto_create_handle_loop on the first request: the SIGTERM and SIGQUIT handlers of the
        running phase and the sigterm_watchdog."""
        self.running_phase = True
        threading.Thread(target=self.sigterm_watchdog, daemon=True, name="sigterm_watchdog").start()

    def sigterm_handler(self, _signum=None) -> None:
        log("SIGTERM received. signum=None frame=None. Draining requests and shutting down...")
        self.gracefully_exit = True

    def sigquit_handler(self, _signum=None) -> None:
        if self.running_phase:
            log("SIGQUIT received. signum=None, frame=None. It usually means one child failed.")
        if self.subprocess_watchdog is not None:
            self.subprocess_watchdog.stop()
        kill_process_tree(os.getpid())

    def sigterm_watchdog(self) -> None:
        while not self.gracefully_exit:
            time.sleep(DRAIN_POLL_S)
        while True:
            with self.lock:
                remaining = list(self.rid_to_state)
            if self.server_status == self.UNHEALTHY:
                log("Signal SIGTERM received while health check failed. Force exiting.")
                break
            if os.environ.get("SGL_FORCE_SHUTDOWN", "false").lower() in ("true", "1"):
                log("Signal SIGTERM received while force shutdown flag set. Force exiting.")
                break
            log(f"Gracefully exiting... Remaining number of requests {len(remaining)}. "
                f"Remaining requests remaining_rids={remaining}.")
            if not remaining:
                break
            time.sleep(DRAIN_POLL_S)
        if self.subprocess_watchdog is not None:
            self.subprocess_watchdog.stop()
        self.send(("shutdown",))
        deadline = time.monotonic() + SCHEDULER_EXIT_TIMEOUT_S
        while time.monotonic() < deadline and any(p.is_alive() for p in self.schedulers):
            time.sleep(0.1)
        stragglers = [p.pid for p in self.schedulers if p.is_alive()]
        if stragglers:
            log(f"Schedulers still alive {SCHEDULER_EXIT_TIMEOUT_S}s after ShutdownReq, killing them "
                f"before they released: {stragglers}")
        kill_process_tree(os.getpid(), include_parent=False)
        if self.stop_hook is not None:
            self.stop_hook()
