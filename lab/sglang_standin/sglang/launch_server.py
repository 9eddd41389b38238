"""LAB STAND-IN for `python -m sglang.launch_server`: no model runs here.

It parses the real 0.5.23 CLI (sglang.srt.server_args), reads the target's and
the drafter's config.json like the real server, then answers SGLang's HTTP
endpoints with deterministic canned results, so deploys, health checks and
benchmarks can be exercised in the lab. Faults come from a JSON knobs file
(SPECFLEET_SGLANG_KNOBS, else /etc/specfleet-lab/sglang-standin.json):
startup_delay_s, exit_after_s, health_fail (re-read on every health request), metrics_fail
(re-read on every /metrics request: 503, a scrape target down).

SIGTERM is a graceful stop, as in the real 0.5.23 (TokenizerManager's SignalHandler and
sigterm_watchdog): /health and /health_generate answer 503 from then on, new requests are
still served, and at the first check that finds none in flight the server shuts its
schedulers down and exits (status 0). Requests that arrive during that shutdown are accepted
but never answered, not even a streaming one's status line (0.5.23 awaits the first chunk
before its 200, and no scheduler is left to make it), and are dropped when the process
exits. The real watchdog checks every 5 s and waits up to 15 s for its schedulers to release
the GPUs; the stand-in checks every DRAIN_CHECK_S and takes SCHEDULER_EXIT_S, to keep lab
restarts short.

With --nnodes > 1 it holds the multi-node rendezvous first (rendezvous.py).

Its GPUs are those CUDA_VISIBLE_DEVICES shows it, as in 0.5.23 (entrypoints/engine.py): one
scheduler process per TP rank of this node, on GPU base_gpu_id + rank * gpu_id_step of the
visible ones. A rank whose GPU is not visible fails as the real scheduler's set_device does
(distributed/bootstrap.py: "CUDA error: invalid device ordinal"), and the server dies of
SIGKILL (launch_phase_sigquit_handler, kill_process_tree). Each rank's stand-in scheduler is a
process holding its GPU (SPECFLEET_LAB_GPU in its environment), which the nvidia-smi stand-in
lists under --query-compute-apps, as the real tool lists the schedulers.
"""

import argparse
import ctypes
import hashlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import sglang
from sglang import rendezvous, speed_model
from sglang.srt.resolution import query_gpu
from sglang.srt.server_args import prepare_server_args

# lab/config.py SGLANG_KNOBS_FILE; the stand-in runs on hosts without lab/.
KNOBS_FILE = "/etc/specfleet-lab/sglang-standin.json"
READY_LINE = "The server is fired up and ready to roll!"
# Never echoed: the real server does not print these either.
SECRET_ARGS = ("api_key", "admin_api_key", "ssl_keyfile_password")
DRAIN_CHECK_S = 0.2  # the real sigterm_watchdog: 5 s
SCHEDULER_EXIT_S = 2.0  # the real one: until its schedulers exit (ShutdownReq), at most 15 s
WORDS = ("alpha", "bravo", "draft", "verify", "token", "block", "tree", "accept",
         "lab", "spec", "decode", "prefill", "cache", "kernel", "batch", "reply")


def read_knobs() -> dict:
    path = os.environ.get("SPECFLEET_SGLANG_KNOBS", KNOBS_FILE)
    try:
        return json.loads(Path(path).read_text())
    except FileNotFoundError:
        return {}


def fail(exc_line: str) -> None:
    """Die like the real server does on an uncaught exception: exit 1."""
    print(f"Traceback (most recent call last):\n{exc_line}", file=sys.stderr, flush=True)
    sys.exit(1)


def load_config(model_dir: str) -> dict:
    """config.json of a local model folder, as transformers' AutoConfig reads it."""
    try:
        return json.loads((Path(model_dir) / "config.json").read_text())
    except (OSError, ValueError):
        fail(f"OSError: {model_dir} does not appear to have a file named config.json. "
             f"Checkout 'https://huggingface.co/{model_dir}/tree/main' for available files.")


def accept_length(args: argparse.Namespace) -> float:
    """A made-up but deterministic acceptance: more draft tokens, more accepted;
    DDTree's tree verify accepts a little more than DFlash's single chain."""
    algo = args.speculative_algorithm
    if algo is None:
        return 1.0
    n = args.speculative_num_draft_tokens or 4
    if algo == "DFLASH":
        return round(min(1 + 0.35 * (n - 1), 6.0), 4)
    if algo == "DDTREE":
        return round(min(1 + 0.35 * (n - 1) + 0.02 * args.speculative_ddtree_budget, 6.5), 4)
    return round(min(1 + 0.25 * (n - 1), 4.0), 4)


def reply(prompt: str, max_tokens: int) -> list[str]:
    """`max_tokens` deterministic words derived from the prompt (a hash chain, 32 words a link)."""
    words, digest = [], hashlib.sha256(prompt.encode()).digest()
    while len(words) < max(1, max_tokens):
        words += [WORDS[b % len(WORDS)] for b in digest]
        digest = hashlib.sha256(digest).digest()
    return words[: max(1, max_tokens)]


class Server:
    """What the handler needs: resolved args, model facts, state, counters."""

    def __init__(self, args, target_config):
        self.args = args
        self.ready = False
        self.exiting = threading.Event()  # SIGTERM received: draining in-flight requests
        self.schedulers_gone = threading.Event()  # drained: nothing generates any more
        self.in_flight = 0
        self.accept_length = accept_length(args)
        self.served_model_name = args.served_model_name or args.model_path
        text_config = target_config.get("text_config", target_config)
        self.model_info = {
            "model_path": args.model_path,
            "tokenizer_path": args.tokenizer_path or args.model_path,
            "is_generation": True,
            "architectures": target_config.get("architectures"),
            "model_type": target_config.get("model_type"),
            "served_model_name": self.served_model_name,
            "tool_call_parser": args.tool_call_parser,
            "reasoning_parser": args.reasoning_parser,
        }
        self.max_model_len = args.context_length or text_config.get("max_position_embeddings", 4096)
        self.lock = threading.Lock()
        self.verify_calls = self.generated_tokens = 0
        # Replies are paced by the lab's speed model (modelled, not measured timings).
        self.engine = speed_model.Engine(args.speculative_algorithm, args.speculative_num_draft_tokens,
                                         getattr(args, "speculative_ddtree_budget", None), self.accept_length)

    def generate(self, prompt: str, max_tokens: int) -> tuple[list[str], dict]:
        words = reply(prompt, max_tokens)
        meta = {"prompt_tokens": len(prompt.split()), "completion_tokens": len(words)}
        if self.args.speculative_algorithm:
            verify_ct = -(-len(words) // int(self.accept_length))  # ceil
            meta.update(spec_accept_length=self.accept_length,
                        spec_accept_rate=round(self.accept_length / self.draft_tokens(), 4),
                        spec_verify_ct=verify_ct)
            with self.lock:
                self.verify_calls += verify_ct
        with self.lock:
            self.generated_tokens += len(words)
        return words, meta

    def draft_tokens(self) -> int:
        return self.args.speculative_num_draft_tokens or 4

    def server_info(self) -> dict:
        info = {k: (None if k in SECRET_ARGS and v else v) for k, v in self.args.resolved_dict().items()}
        info["internal_states"] = [{"avg_spec_accept_length": self.accept_length}]
        info["version"] = sglang.__version__
        info["lab_speed_model"] = self.engine.describe()
        return info

    def metrics(self) -> str:
        label = f'{{model_name="{self.served_model_name}"}}'
        lines = [f"sglang:generation_tokens_total{label} {self.generated_tokens}"]
        if self.args.speculative_algorithm:
            lines += [
                f"sglang:spec_accept_length{label} {self.accept_length}",
                f"sglang:spec_accept_rate{label} {self.accept_length / self.draft_tokens():.4f}",
                f"sglang:spec_num_draft_tokens{label} {self.draft_tokens()}",
                f"sglang:spec_num_steps{label} {self.args.speculative_num_steps or 1}",
                f"sglang:spec_verify_calls_total{label} {self.verify_calls}",
            ]
        return "\n".join(lines) + "\n"


class Handler(BaseHTTPRequestHandler):
    server_version = "uvicorn"
    protocol_version = "HTTP/1.1"
    app: Server  # set on the class in serve()

    def log_message(self, fmt, *args):  # uvicorn-like access log, no headers
        print(f'INFO:     {self.client_address[0]} - "{self.requestline}" {args[1] if len(args) > 1 else ""}',
              file=sys.stderr, flush=True)

    def send_json(self, code: int, body) -> None:
        self.send_body(code, json.dumps(body).encode(), "application/json")

    def send_body(self, code: int, data: bytes, ctype: str) -> None:
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def authorized(self, path: str) -> bool:
        """Like the real middleware: with --api-key, all but health, ready and
        metrics need `Authorization: Bearer <key>`."""
        key = self.app.args.api_key
        if not key or path.startswith(("/health", "/ready", "/metrics")):
            return True
        return self.headers.get("Authorization", "") == f"Bearer {key}"

    def do_GET(self):
        self.route("GET")

    def do_POST(self):
        self.route("POST")

    def route(self, method: str) -> None:
        path = self.path.split("?", 1)[0]
        if not self.authorized(path):
            return self.send_json(401, {"error": "Unauthorized"})
        handler = ROUTES.get((method, path))
        if handler is None:
            return self.send_json(404, {"detail": "Not Found"})
        body = {}
        if method == "POST":
            raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            try:
                body = json.loads(raw or b"{}")
            except ValueError:
                return self.send_json(400, {"error": "invalid JSON body"})
        if path not in GENERATING:
            return handler(self, body)
        if self.app.schedulers_gone.is_set():  # accepted, never answered: dropped at the exit
            time.sleep(SCHEDULER_EXIT_S * 2)
            return
        with self.app.lock:  # what a graceful stop waits for (the real server's rid_to_state)
            self.app.in_flight += 1
        try:
            handler(self, body)
        finally:
            with self.app.lock:
                self.app.in_flight -= 1

    def health(self, _body):
        if not self.app.ready or self.app.exiting.is_set() or read_knobs().get("health_fail"):
            return self.send_body(503, b"", "text/plain")
        self.send_body(200, b"", "text/plain")

    def ready(self, _body):
        self.send_json(200 if self.app.ready else 503, {"status": "ready" if self.app.ready else "starting"})

    def model_info(self, _body):
        self.send_json(200, self.app.model_info)

    def server_info(self, _body):
        self.send_json(200, self.app.server_info())

    def models(self, _body):
        name = self.app.served_model_name
        self.send_json(200, {"object": "list", "data": [{
            "id": name, "object": "model", "created": 0, "owned_by": "sglang",
            "root": name, "max_model_len": self.app.max_model_len}]})

    def metrics(self, _body):
        if not self.app.args.enable_metrics:
            return self.send_json(404, {"detail": "Not Found"})
        if read_knobs().get("metrics_fail"):
            return self.send_body(503, b"", "text/plain")
        self.send_body(200, self.app.metrics().encode(), "text/plain; version=0.0.4")

    def generate(self, body):
        if not self.app.ready:
            return self.send_json(503, {"error": "server is starting"})
        params = body.get("sampling_params") or {}
        words, meta = self.app.generate(str(body.get("text", "")), int(params.get("max_new_tokens", 16)))
        for _ in self.app.engine.steps(len(words)):
            pass
        meta["finish_reason"] = {"type": "length", "length": len(words)}
        self.send_json(200, {"text": " ".join(words), "meta_info": meta})

    def chat(self, body):
        if not self.app.ready:
            return self.send_json(503, {"error": "server is starting"})
        prompt = "\n".join(str(m.get("content", "")) for m in body.get("messages", []))
        max_tokens = int(body.get("max_tokens") or body.get("max_completion_tokens") or 16)
        words, meta = self.app.generate(prompt, max_tokens)
        created = int(time.time())
        cid = "chatcmpl-" + hashlib.sha256(prompt.encode()).hexdigest()[:16]
        usage = {"prompt_tokens": meta["prompt_tokens"], "completion_tokens": meta["completion_tokens"],
                 "total_tokens": meta["prompt_tokens"] + meta["completion_tokens"]}
        model = self.app.served_model_name
        if not body.get("stream"):
            for _ in self.app.engine.steps(len(words)):
                pass
            return self.send_json(200, {
                "id": cid, "object": "chat.completion", "created": created, "model": model,
                "choices": [{"index": 0, "finish_reason": "length",
                             "message": {"role": "assistant", "content": " ".join(words)}}],
                "usage": usage})
        # Server-sent events, one a decode step (paced by the speed model), as OpenAI
        # streaming clients expect; the last one carries finish_reason and usage.
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        sent = 0
        for count in self.app.engine.steps(len(words)):
            text = " ".join(words[sent:sent + count])
            event = {"id": cid, "object": "chat.completion.chunk", "created": created, "model": model,
                     "choices": [{"index": 0, "finish_reason": None,
                                  "delta": {"role": "assistant", "content": text if sent == 0 else " " + text}}]}
            sent += count
            if sent == len(words):
                event["choices"][0]["finish_reason"] = "length"
                event["usage"] = usage
            self.send_chunk(f"data: {json.dumps(event)}\n\n".encode())
        self.send_chunk(b"data: [DONE]\n\n")
        self.send_chunk(b"")

    def send_chunk(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    def flush_cache(self, _body):
        self.send_body(200, b"Cache flushed.\nPlease check backend logs for more details. "
                            b"(When there are running or waiting requests, the operation will not be performed.)\n",
                       "text/plain")


ROUTES = {
    ("GET", "/health"): Handler.health,
    ("GET", "/health_generate"): Handler.health,
    ("GET", "/ready"): Handler.ready,
    ("GET", "/model_info"): Handler.model_info,
    ("GET", "/get_model_info"): Handler.model_info,
    ("GET", "/server_info"): Handler.server_info,
    ("GET", "/get_server_info"): Handler.server_info,
    ("GET", "/v1/models"): Handler.models,
    ("GET", "/metrics"): Handler.metrics,
    ("POST", "/generate"): Handler.generate,
    ("POST", "/v1/chat/completions"): Handler.chat,
    ("POST", "/flush_cache"): Handler.flush_cache,
}
GENERATING = ("/generate", "/v1/chat/completions")


PR_SET_PDEATHSIG = 1


def start_schedulers(args) -> list[subprocess.Popen]:
    """This node's TP ranks, each a process holding its GPU (dying with the server), or the real
    failure of a rank whose GPU CUDA does not show."""
    visible = query_gpu()["visible"]
    ranks = args.tp_size * args.pp_size // max(args.nnodes, 1)
    held = []
    for rank in range(ranks):
        gpu_id = args.base_gpu_id + rank * args.gpu_id_step
        if gpu_id >= len(visible):
            print(f"Context: device=cuda gpu_id={gpu_id} CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')} "
                  f"tp_rank={rank}", file=sys.stderr, flush=True)
            print("Scheduler hit an exception: Traceback (most recent call last):\n"
                  "RuntimeError: CUDA error: invalid device ordinal", file=sys.stderr, flush=True)
            print("Received sigquit from a child process. It usually means the child failed.", file=sys.stderr,
                  flush=True)
            for process in held:
                process.kill()
            os.kill(os.getpid(), signal.SIGKILL)
        held.append(subprocess.Popen(
            [f"sglang::scheduler_TP{rank}", "infinity"], executable="/bin/sleep",
            env={"SPECFLEET_LAB_GPU": str(visible[gpu_id]), "PATH": "/usr/bin:/bin"},
            preexec_fn=lambda: ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGKILL),
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    return held


def main(argv: list[str]) -> None:
    args = prepare_server_args(argv)
    knobs = read_knobs()
    target_config = load_config(args.model_path)
    try:
        args.resolve_once()  # the real post-init rules (srt/resolution.py)
        args.check_server_args()  # and the checks the engine runs before it launches
    except Exception as exc:
        fail(f"{type(exc).__name__}: {exc}")

    start_schedulers(args)  # before any thread: each rank's process holds its GPU until the server exits
    if args.nnodes > 1:
        # Several nodes: rank 0 serves only once every rank joined; the others serve nothing.
        rendezvous.check_interfaces()
        if args.node_rank > 0:
            rendezvous.watch({0: rendezvous.join(args)})
            threading.Event().wait()
        rendezvous.watch(rendezvous.gather(args))

    app = Server(args, target_config)
    Handler.app = app
    httpd = ThreadingHTTPServer((args.host, args.port), Handler)
    httpd.daemon_threads = True
    print(f"[lab stand-in sglang {sglang.__version__}] model={args.model_path} "
          f"speculative_algorithm={args.speculative_algorithm} "
          f"num_draft_tokens={args.speculative_num_draft_tokens} on {args.host}:{args.port}",
          flush=True)

    if knobs.get("exit_after_s") is not None:
        def crash():
            time.sleep(float(knobs["exit_after_s"]))
            print("RuntimeError: lab stand-in fault: exit_after_s", file=sys.stderr, flush=True)
            os._exit(1)
        threading.Thread(target=crash, daemon=True).start()

    def warm_up():
        time.sleep(float(knobs.get("startup_delay_s", 0)))
        app.ready = True
        print(READY_LINE, flush=True)
    threading.Thread(target=warm_up, daemon=True).start()

    def drain_then_exit():
        app.exiting.wait()
        shown = None
        while True:
            with app.lock:
                remaining = app.in_flight
            if remaining != shown:
                print(f"Gracefully exiting... Remaining number of requests {remaining}.", flush=True)
                shown = remaining
            if not remaining:
                app.schedulers_gone.set()
                time.sleep(SCHEDULER_EXIT_S)
                os._exit(0)
            time.sleep(DRAIN_CHECK_S)

    def sigterm(signum, frame):
        print(f"SIGTERM received. signum={signum}. Draining requests and shutting down...", flush=True)
        app.exiting.set()
    signal.signal(signal.SIGTERM, sigterm)
    threading.Thread(target=drain_then_exit, daemon=True).start()
    httpd.serve_forever()


if __name__ == "__main__":
    main(sys.argv[1:])
