"""LAB STAND-IN for SGLang 0.5.23's scheduler processes (srt/managers/scheduler.py): no model runs.

One process per local TP rank (engine.py:931-961), titled `sglang::scheduler[_TP<rank>]`
(scheduler.py:6294). Each first sets PR_SET_PDEATHSIG=SIGKILL (scheduler.py:6269) and installs
no SIGTERM handler (mem_cache/allocator/unified_sub_pool.py:103, "the scheduler subprocess
installs none"), so a SIGTERM kills it at once with every request it holds.

Rank 0 holds the batch and paces it with the lab's speed model (sglang/speed_model.py): a
prefill batch admits waiting requests (up to max_running_requests), a decode step advances every
running request, and every batch waits for the other ranks (the stand-in's NCCL collective: a
rank that is gone leaves rank 0 waiting for ever, as a collective with a dead peer does). Token
ranges go to the detokenizer, which turns them into text for the main process.

Health probes (scheduler.py:2240-2247, 5182-5197, 5245): a probe that finds the scheduler fully
idle runs as a one-token request; one that finds it busy is answered with an acknowledgement
after the next batch (or when it goes idle), so a probe waits for the batch in progress.

Load figures: the `/v1/loads` snapshot is published after every prefill batch, every
load_snapshot_publish_interval decode steps and when idle (scheduler.py:871-890, 5082, 5322);
the `sglang:num_running_reqs`/`num_queue_reqs` gauges after every prefill batch, every
decode_log_interval decode steps and when idle with a stale value (metrics_reporter.py:1486-1517).

Lab knobs: `batch_stall_s` makes every batch take at least that long (a long prefill chunk, a
stalled GPU: what makes the real /health time out, sgl-project/sglang#22511); `exit_after_s`
makes rank 0 fail that many seconds after it starts, as a scheduler exception does
(scheduler.py:6370-6373: it logs and sends SIGQUIT to the main process).
"""

import collections
import os
import signal
import threading
import time
from multiprocessing.connection import Connection

from sglang import speed_model
from sglang.srt.distributed import listen_gloo, listen_store
from sglang.srt.utils import CachedKnobs, hang, kill_itself_when_parent_died, log, read_knobs, set_process_title

def title(tp_rank: int, tp_size: int) -> str:
    return f"sglang::scheduler_TP{tp_rank}" if tp_size > 1 else "sglang::scheduler"


def no_device(tp_rank: int) -> None:
    """The rank's set_device fails (distributed/bootstrap.py: it logs its context and raises); the scheduler
    logs the exception and SIGQUITs the main process (scheduler.py:6370-6373), then returns."""
    log(f"Context: device=cuda CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')} tp_rank={tp_rank}")
    log("Scheduler hit an exception: Traceback (most recent call last):\n"
        "RuntimeError: CUDA error: invalid device ordinal")
    os.kill(os.getppid(), signal.SIGQUIT)


def run_peer_rank(tp_rank: int, tp_size: int, link: Connection, has_gpu: bool = True) -> None:
    """A rank other than 0: takes part in every batch, exits 0 on ShutdownReq."""
    kill_itself_when_parent_died()
    set_process_title(title(tp_rank, tp_size))
    if not has_gpu:
        return no_device(tp_rank)
    gloo = listen_gloo()  # noqa: F841 (held while the rank runs)
    link.send(("ready", tp_rank))
    while True:
        try:
            message = link.recv()
        except (EOFError, OSError):
            hang()
        if message[0] == "step":
            link.send(("ok",))
        elif message[0] == "shutdown":
            return


class Req:
    __slots__ = ("rid", "total", "prompt_tokens", "steps", "done", "health")

    def __init__(self, rid: str, total: int, prompt_tokens: int, health: bool = False):
        self.rid, self.total, self.prompt_tokens, self.health = rid, total, prompt_tokens, health
        self.steps = self.done = 0


class Scheduler:
    def __init__(self, config: dict, from_tokenizer: Connection, to_tokenizer: Connection,
                 to_detokenizer: Connection, peers: list[Connection]):
        self.config = config
        self.from_tokenizer, self.to_tokenizer, self.to_detokenizer, self.peers = (
            from_tokenizer, to_tokenizer, to_detokenizer, peers)
        self.pace = config["pace"]  # speed_model.Pace: this server's step time
        self.speculative = config["algorithm"] is not None
        self.accept_length = config["accept_length"]
        self.max_running = config["max_running_requests"]  # srt/kv_pool.py: resolve_max_num_reqs
        self.max_total_num_tokens = config["max_total_num_tokens"]  # srt/kv_pool.py
        self.waiting: collections.deque[Req] = collections.deque()
        self.running: list[Req] = []
        self.health_acks = 0
        self.decode_ct = 0
        self.gauge_running = self.gauge_queue = 0
        self.generated_since = (time.monotonic(), 0)
        self.gen_throughput = 0.0
        self.knobs = CachedKnobs()

    # -- the loop --------------------------------------------------------------------------

    def run(self) -> None:
        while True:
            busy = bool(self.waiting or self.running)
            if not busy:
                self.on_idle()
            # Idle: block until a message; busy: take what has arrived and run the next batch.
            if self.from_tokenizer.poll(None if not busy else 0):
                while True:
                    try:
                        message = self.from_tokenizer.recv()
                    except (EOFError, OSError):
                        hang()
                    if message[0] == "shutdown":
                        self.shutdown()
                        return
                    self.handle(message)
                    if not self.from_tokenizer.poll(0):
                        break
            if self.waiting and len(self.running) < self.max_running:
                self.prefill()
            elif self.running:
                self.decode()

    def handle(self, message: tuple) -> None:
        kind = message[0]
        if kind == "generate":
            _, rid, prompt, total, prompt_tokens = message
            self.waiting.append(Req(rid, total, prompt_tokens))
            self.send(self.to_detokenizer, ("new", rid, prompt, total))
        elif kind == "health":
            if self.waiting or self.running:
                self.health_acks += 1  # answered after the next batch
            else:
                self.waiting.append(Req(message[1], 1, 1, health=True))
                self.send(self.to_detokenizer, ("new", message[1], "", 1))
        elif kind == "abort":
            self.waiting = collections.deque(r for r in self.waiting if r.rid != message[1])
            self.running = [r for r in self.running if r.rid != message[1]]
            self.send(self.to_detokenizer, ("abort", message[1]))

    def batch_time(self, seconds: float) -> None:
        time.sleep(max(seconds, float(self.knobs.get("batch_stall_s", 0) or 0)))
        try:  # every rank runs every batch
            for peer in self.peers:
                peer.send(("step",))
            for peer in self.peers:
                peer.recv()
        except (EOFError, OSError):
            hang()

    def prefill(self) -> None:
        admitted = []
        while self.waiting and len(self.running) + len(admitted) < self.max_running:
            admitted.append(self.waiting.popleft())
        self.batch_time(speed_model.PREFILL_S)
        self.running += [r for r in admitted if not r.health]
        # The real prefill's output (each request's first token) reaches the main process; the speed
        # model counts tokens from the decode steps, so only a health probe's token travels here.
        self.send(self.to_detokenizer, ("batch", [(r.rid, 0, 1, True) for r in admitted if r.health]))
        self.after_batch(publish_loads=True, update_gauges=True)

    def decode(self) -> None:
        self.batch_time(self.pace.step_seconds(len(self.running)))
        out = []
        for r in self.running:
            r.steps += 1
            now = min(r.total, speed_model.tokens_after(r.steps, self.accept_length))
            if now > r.done:
                out.append((r.rid, r.done, now, now == r.total))
                self.count_generated(now - r.done)
                r.done = now
        self.running = [r for r in self.running if r.done < r.total]
        self.send(self.to_detokenizer, ("batch", out))
        self.decode_ct += 1
        self.after_batch(publish_loads=self.decode_ct % self.config["load_snapshot_publish_interval"] == 0,
                         update_gauges=self.decode_ct % self.config["decode_log_interval"] == 0)

    def after_batch(self, publish_loads: bool, update_gauges: bool) -> None:
        self.maybe_send_health_check_signal()
        if publish_loads or update_gauges:
            self.publish(update_gauges)

    def on_idle(self) -> None:
        self.maybe_send_health_check_signal()
        stale = (self.gauge_running, self.gauge_queue) != (len(self.running), len(self.waiting))
        self.publish(update_gauges=stale)

    def maybe_send_health_check_signal(self) -> None:
        if self.health_acks:
            self.health_acks -= 1  # one a batch (scheduler.py:5182-5197: popleft)
            self.send(self.to_tokenizer, ("health_ack",))

    # -- figures ---------------------------------------------------------------------------

    def count_generated(self, tokens: int) -> None:
        since, count = self.generated_since
        count += tokens
        elapsed = time.monotonic() - since
        if elapsed >= 1.0:
            self.gen_throughput, self.generated_since = count / elapsed, (time.monotonic(), 0)
        else:
            self.generated_since = (since, count)

    def publish(self, update_gauges: bool) -> None:
        used = sum(r.prompt_tokens + r.done for r in self.running)
        load = {
            "timestamp": time.time(), "dp_rank": 0,
            "num_running_reqs": len(self.running), "num_waiting_reqs": len(self.waiting),
            "num_waiting_uncached_tokens": sum(r.prompt_tokens for r in self.waiting),
            "num_used_tokens": used, "num_total_tokens": used, "num_active_tokens": used,
            "num_prealloc_ready_tokens": 0, "max_total_num_tokens": self.max_total_num_tokens,
            "max_running_requests": self.max_running, "token_usage": round(used / self.max_total_num_tokens, 4),
            "gen_throughput": round(self.gen_throughput if self.running else 0.0, 2),
            "cache_hit_rate": 0.0, "utilization": round(min(1.0, len(self.running) / self.max_running), 4),
            "queues": {"waiting": len(self.waiting), "grammar": 0, "paused": 0, "retracted": 0, "prealloc_ready": 0},
        }
        if self.speculative:
            load["speculative"] = {"accept_length": self.accept_length,
                                   "accept_rate": round(self.accept_length / (self.config["num_draft_tokens"] or 4), 4)}
        if update_gauges:
            self.gauge_running, self.gauge_queue = len(self.running), len(self.waiting)
        self.send(self.to_tokenizer, ("loads", load, update_gauges))

    # -- ending ----------------------------------------------------------------------------

    def shutdown(self) -> None:
        """ShutdownReq (scheduler.py:6170-6173): every rank leaves its loop and exits 0."""
        for peer in self.peers:
            try:
                peer.send(("shutdown",))
            except OSError:
                pass

    @staticmethod
    def send(link: Connection, message: tuple) -> None:
        try:
            link.send(message)
        except OSError:  # ZMQ queues to a peer that is gone without an error
            pass


def run_scheduler_process(tp_size: int, config: dict, from_tokenizer: Connection, to_tokenizer: Connection,
                          to_detokenizer: Connection, peers: list[Connection], has_gpu: bool = True) -> None:
    """TP rank 0 (the only one the main process talks to)."""
    kill_itself_when_parent_died()
    set_process_title(title(0, tp_size))
    if not has_gpu:
        return no_device(0)
    gloo = listen_gloo()  # noqa: F841 (held while the scheduler runs, as the store below)
    if config["store_port"] is not None:
        try:
            store = listen_store(config["store_port"])  # noqa: F841
        except RuntimeError as error:
            log(f"Scheduler hit an exception: Traceback (most recent call last):\n{error}")
            os.kill(os.getppid(), signal.SIGQUIT)
            return
    for peer in peers:
        peer.recv()  # their init (the real ranks load their weights shards together)
    exit_after_s = read_knobs().get("exit_after_s")
    if exit_after_s is not None:
        def crash():
            time.sleep(float(exit_after_s))
            log("Scheduler hit an exception: Traceback (most recent call last):\n"
                "RuntimeError: lab stand-in fault: exit_after_s")
            os.kill(os.getppid(), signal.SIGQUIT)
        threading.Thread(target=crash, daemon=True).start()
    to_tokenizer.send(("ready", 0))
    Scheduler(config, from_tokenizer, to_tokenizer, to_detokenizer, peers).run()
