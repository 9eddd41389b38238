"""LAB STAND-IN for `python -m sglang.launch_server`: no model runs here.

It parses the real 0.5.23 CLI (sglang.srt.server_args), reads the target's and the drafter's
config.json like the real server, starts the real server's processes and answers SGLang's HTTP
endpoints with deterministic canned results, so deploys, health checks, stops and benchmarks can
be exercised in the lab. Paths below are inside the sglang 0.5.23 wheel.

Processes: this main process serves HTTP and plays the TokenizerManager (requests, /health, the
SIGTERM drain, SIGQUIT: srt/managers/tokenizer_manager.py here); it spawns one scheduler process
per local TP rank (at most 8) and a detokenizer (srt/entrypoints/engine.py here). Every generation
goes through them, so a request whose scheduler died never completes. A SubprocessWatchdog polls
the children every second and kills the whole tree when one died with a non-zero code
(utils/watchdog.py:166-222), so a SIGTERM that reaches the children (systemd's default
KillMode=control-group) ends the server at once, its requests dropped, the main process by SIGKILL.

SIGINT is uvicorn's (uvicorn/server.py:280-349; SGLang keeps it): stop accepting, let the HTTP
requests in flight finish, SIGKILL the children (launch_server.py:83-86), die of SIGINT; a second
SIGINT stops waiting.

Faults come from a JSON knobs file (SPECFLEET_SGLANG_KNOBS, else /etc/specfleet-lab/sglang-standin.json):
startup_delay_s (the weights' load), exit_after_s (the rank-0 scheduler fails), batch_stall_s
(every batch takes at least that long: a stalled GPU), health_fail (re-read on every health and
/ready request: 503, as a failed health check, which leaves the server UnHealthy for /ready until a
health check generates again, as in the real server), metrics_fail (re-read on every /metrics request: 503, a scrape
target down), sized_as ({"target": folder, "drafter": folder}: the checkpoints whose config.json and weights'
sizes the pool and the request caps are sized for, in place of the lab hub's tiny models: srt/kv_pool.py).

With --nnodes > 1 it holds the multi-node rendezvous first (rendezvous.py). Node ranks >= 1 run
their schedulers, log and ignore SIGTERM (engine.py:1262-1273), then serve only the dummy health
server on --host:--port (utils/common.py launch_dummy_health_check_server: /ping, /health and
/health_generate answer 200 unasked of the schedulers; /metrics with --enable-metrics), and exit
once their schedulers exit: on rank 0's ShutdownReq broadcast, or killed.

GPUs: those CUDA_VISIBLE_DEVICES shows the server (srt/resolution.py visible_gpus); TP rank i of
this node runs on visible GPU base_gpu_id + i * gpu_id_step (engine.py:931-961), a rank whose GPU
CUDA does not show fails as the real scheduler's set_device does (srt/entrypoints/engine.py here).
"""

import hashlib
import json
import os
import secrets
import select
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import sglang
from sglang import rendezvous, speed_model
from sglang.srt.entrypoints import engine
from sglang.srt import distributed, kv_pool, request_rules
from sglang.srt.resolution import query_gpu
from sglang.srt.managers.tokenizer_manager import ClientGone, TokenizerManager
from sglang.srt.parser import reasoning_parser
from sglang.srt.server_args import prepare_server_args
from sglang.srt.utils import SignalLoop, SubprocessWatchdog, kill_process_tree, log, read_knobs
from torch import _gpus

READY_LINE = "The server is fired up and ready to roll!"
DEFAULT_MODEL_NAME = "default"  # entrypoints/openai/protocol.py
# The stand-in's model stops at max_tokens: no EOS, no stop string.
FINISH_REASON = "length"
# http_server.py _execute_server_warmup: the first request, which starts the running phase.
WARMUP_PROMPT, WARMUP_TOKENS = "The capital city of France is", 8
LOAD_SECTIONS = {"core", "memory", "spec", "lora", "disagg", "queues", "all"}  # load_snapshot.py
SCHEDULER_LABELS = ("engine_type", "tp_rank", "pp_rank", "moe_ep_rank")  # metrics_collector.py:1382-1392
# The routes served here that http_server.py marks @auth_level(AuthLevel.ADMIN_OPTIONAL) (checked against the
# wheel's source in tests/lab_code/test_sglang_standin.py).
ADMIN_OPTIONAL = frozenset({"/flush_cache", "/update_weights_from_disk", "/set_internal_state", "/load_lora_adapter"})


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


def pace(args, target_config: dict) -> tuple[speed_model.Pace, float]:
    """This server's step time and accept length, as the speed model (sglang/speed_model.py) has them for
    its target, settings and TP size; at TP > 1 the link is what NCCL takes between this node's GPUs (the
    lab's torch, torch/_gpus.py `ring`: the GPU profile's topology and this process's NCCL_P2P_* variables)."""
    algorithm, n = args.speculative_algorithm, args.speculative_num_draft_tokens
    budget = getattr(args, "speculative_ddtree_budget", None)
    ring_size = min(max(1, args.tp_size // max(1, args.nnodes)), query_gpu()["count"])
    link = speed_model.link(_gpus.ring(ring_size)) if ring_size > 1 else None
    return speed_model.server(speed_model.target(target_config), algorithm, n, budget, args.tp_size, link,
                              args.speculative_num_steps, args.speculative_eagle_topk)


def scheduler_config(args, target_config: dict) -> dict:
    timing, accept = pace(args, target_config)
    return {"algorithm": args.speculative_algorithm, "num_draft_tokens": args.speculative_num_draft_tokens,
            "ddtree_budget": getattr(args, "speculative_ddtree_budget", None), "accept_length": accept,
            "pace": timing,
            "decode_log_interval": args.decode_log_interval,
            "load_snapshot_publish_interval": args.load_snapshot_publish_interval}


class Server:
    """What the handler needs: resolved args, model facts, the tokenizer manager, counters."""

    def __init__(self, args, target_config, tokenizer_manager: TokenizerManager, config: dict):
        self.args = args
        self.tm = tokenizer_manager
        self.serving = False  # warmed up: outside requests are served
        self.pace, self.accept_length = config["pace"], config["accept_length"]
        max_total_num_tokens = config["max_total_num_tokens"]
        self.served_model_name = args.served_model_name or args.model_path
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
        self.max_model_len = config["context_len"]
        self.lock = threading.Lock()
        self.verify_calls = self.generated_tokens = 0
        self.accelerator = None
        self.startup_time = time.time()
        # managers/scheduler.py get_init_info, as the tokenizer manager keeps it.
        self.max_running_requests = config["max_running_requests"]
        self.scheduler_info = {"status": "ready", "max_total_num_tokens": max_total_num_tokens,
                               "max_req_input_len": config["max_req_input_len"],
                               "startup_time": self.startup_time, "hicache_object_layout": None}
        # The HTTP layer: requests being answered (what uvicorn's shutdown waits for), by endpoint
        # for sglang:http_requests_active, and the open connections with whether one is busy.
        self.http_in_flight = 0
        self.active: dict[tuple[str, str], int] = {}
        self.connections: dict[socket.socket, bool] = {}
        self.closing = False

    def meta(self, prompt: str, completion_tokens: int) -> dict:
        meta = {"prompt_tokens": len(prompt.split()), "completion_tokens": completion_tokens}
        if self.args.speculative_algorithm:
            verify_ct = -(-completion_tokens // int(self.accept_length))  # ceil
            meta.update(spec_accept_length=self.accept_length,
                        spec_accept_rate=round(self.accept_length / self.draft_tokens(), 4),
                        spec_verify_ct=verify_ct)
            with self.lock:
                self.verify_calls += verify_ct
        with self.lock:
            self.generated_tokens += completion_tokens
        return meta

    def draft_tokens(self) -> int:
        return self.args.speculative_num_draft_tokens or 4

    def server_info(self) -> dict:
        """GET /server_info (entrypoints/http_server.py server_info, utils/common.py build_server_info): every
        resolved argument, api_key and admin_api_key included, the launch command (the argv as given,
        a key the launcher appended included), the scheduler's init info, then the live state."""
        info = {**self.args.resolved_dict(), "launch_command": self.args.launch_command,
                **self.scheduler_info, "kv_events": None,
                "startup_time": self.startup_time,
                # managers/scheduler_components/internal_state.py: the cap the scheduler sized, beside the
                # resolved --max-running-requests it may lower.
                "internal_states": [{"avg_spec_accept_length": self.accept_length,
                                     "effective_max_running_requests_per_dp": self.max_running_requests}],
                "version": sglang.__version__, "frontend": "python"}
        info["lab_speed_model"] = speed_model.describe(self.pace, self.accept_length)
        return info

    def metrics(self) -> str:
        # Labelled as the real collectors label them (observability/metrics_collector.py): the tokenizer's
        # (tokenizer_metric_labels) and the rank-0 scheduler's, which add the ranks.
        tokenizer = f'model_name="{self.served_model_name}",engine_type="unified"'
        labels = ",".join([tokenizer, *(f'{k}="{v}"' for k, v in zip(SCHEDULER_LABELS[1:], (0, 0, 0)))])
        # The stand-in counts every request as streamed or not alike: one series.
        lines = [f'sglang:generation_tokens_total{{{tokenizer},is_streaming="false"}} {self.generated_tokens}']
        if self.args.speculative_algorithm:
            lines += [
                f"sglang:spec_accept_length{{{labels}}} {self.accept_length}",
                f"sglang:spec_accept_rate{{{labels}}} {self.accept_length / self.draft_tokens():.4f}",
                f"sglang:spec_num_draft_tokens{{{labels}}} {self.draft_tokens()}",
                f"sglang:spec_num_steps{{{labels}}} {self.args.speculative_num_steps or 1}",
                f"sglang:spec_verify_calls_total{{{tokenizer}}} {self.verify_calls}",
            ]
        running, queued = self.tm.gauges
        for name, text, value in (("num_running_reqs", "The number of running requests.", running),
                                  ("num_queue_reqs", "The number of requests in the waiting queue.", queued),
                                  ("num_grammar_queue_reqs", "The number of requests in the grammar waiting queue.", 0)):
            lines += [f"# HELP sglang:{name} {text}", f"# TYPE sglang:{name} gauge",
                      f"sglang:{name}{{{labels}}} {float(value)}"]
        # http_request_metrics.py:24-45: requests whose handler has not returned (a stream's returns
        # when its first chunk is sent), this scrape included.
        lines += ["# HELP sglang:http_requests_active Number of currently active HTTP requests",
                  "# TYPE sglang:http_requests_active gauge"]
        with self.lock:
            active = sorted(self.active.items())
        lines += [f'sglang:http_requests_active{{endpoint="{path}",method="{method}"}} {float(count)}'
                  for (path, method), count in active]
        return "\n".join(lines) + "\n"

    def loads(self, include: set[str] | None, dp_rank: int | None) -> dict:
        """GET /v1/loads (entrypoints/v1_loads.py:96-150; LoadSnapshot.to_dict, load_snapshot.py:196-240)."""
        if self.accelerator is None:
            try:
                self.accelerator = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                                                  capture_output=True, text=True).stdout.splitlines()[0].strip()
            except (OSError, IndexError):
                self.accelerator = ""
        snapshot = self.tm.load
        loads = []
        if snapshot is not None and dp_rank in (None, 0):
            load = {key: value for key, value in snapshot.items() if not isinstance(value, dict)}
            load.setdefault("total_prefill_uncached_tokens", 0)
            load.setdefault("total_prefill_busy_us", 0)
            load.setdefault("decode_moments", None)
            sections = {"memory": ("memory", {"weight_gb": 0.0, "kv_cache_gb": 0.0, "graph_gb": 0.0,
                                              "token_capacity": snapshot["max_total_num_tokens"]}),
                        "spec": ("speculative", snapshot.get("speculative")),
                        "queues": ("queues", snapshot.get("queues"))}
            for name, (field, value) in sections.items():
                if value is not None and (include is None or "all" in include or name in include):
                    load[field] = value
            loads.append(load)
        return {"timestamp": datetime.now(timezone.utc).isoformat(), "version": sglang.__version__,
                "accelerator": self.accelerator or None, "num_accelerators": self.args.tp_size * self.args.pp_size,
                "loads": loads}


class Answer:
    """One OpenAI-API answer's shared fields: its id, its time, the model the request named (protocol.py's
    default "default" where it named none) and whether a stream ends with a usage chunk."""

    def __init__(self, prefix: str, prompt: str, body: dict):
        self.id = f"{prefix}-" + hashlib.sha256(prompt.encode()).hexdigest()[:16]
        self.created = int(time.time())
        self.model = str(body.get("model") or DEFAULT_MODEL_NAME)
        self.include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        self.started = 0  # decode steps streamed

    def head(self, kind: str) -> dict:
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model}

    def chat_chunk(self, delta: dict, finish_reason: str | None = None) -> dict:
        return {**self.head("chat.completion.chunk"), "choices": [{
            "index": 0, "delta": {"reasoning_content": None, **delta}, "logprobs": None,
            "finish_reason": finish_reason, "matched_stop": None}]}

    @staticmethod
    def completion_choice(text: str, finish_reason: str | None) -> dict:
        return {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason, "matched_stop": None}


class Handler(BaseHTTPRequestHandler):
    server_version = "uvicorn"
    protocol_version = "HTTP/1.1"
    app: Server  # set on the class in main()

    def setup(self):
        super().setup()
        with self.app.lock:
            self.app.connections[self.connection] = False

    def finish(self):
        with self.app.lock:
            self.app.connections.pop(self.connection, None)
        super().finish()

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

    def authorized(self, method: str, path: str) -> bool:
        """The real middleware's decision (``allowed``) for this request."""
        args = self.app.args
        return allowed(method, path, self.headers.get("Authorization"), args.api_key, args.admin_api_key)

    def client_gone(self) -> bool:
        """The client closed its connection (what request.is_disconnected() finds)."""
        try:
            readable, _, _ = select.select([self.connection], [], [], 0)
            return bool(readable) and self.connection.recv(1, socket.MSG_PEEK) == b""
        except OSError:
            return True

    def do_GET(self):
        self.route("GET")

    def do_POST(self):
        self.route("POST")

    def do_PUT(self):
        self.route("PUT")

    def route(self, method: str) -> None:
        app = self.app
        if app.closing:  # uvicorn closed this idle connection when it began its shutdown
            self.close_connection = True
            return
        path, _, query = self.path.partition("?")
        handler = ROUTES.get((method, path))
        key = (path, method)
        with app.lock:
            app.http_in_flight += 1
            app.connections[self.connection] = True
            app.active[key] = app.active.get(key, 0) + 1
        self.counted = key
        try:
            if not self.authorized(method, path):
                return self.send_json(401, {"error": "Unauthorized"})
            if handler is None:
                return self.send_json(404, {"detail": "Not Found"})
            body = {}
            if method == "POST":
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                try:
                    body = json.loads(raw or b"{}")
                except ValueError:
                    return self.send_json(400, {"error": "invalid JSON body"})
            self.query = urllib.parse.parse_qs(query)
            handler(self, body)
        except ClientGone:
            self.close_connection = True
        finally:
            self.handler_returned()
            with app.lock:
                app.http_in_flight -= 1
                app.connections[self.connection] = False
            if app.closing:
                self.close_connection = True

    def handler_returned(self) -> None:
        """sglang:http_requests_active counts down when the handler returns its response."""
        key, self.counted = self.counted, None
        if key is not None:
            with self.app.lock:
                self.app.active[key] -= 1
                if not self.app.active[key]:
                    del self.app.active[key]

    def health_failing(self) -> bool:
        """The health_fail knob: the engine fails its health checks, leaving what a failed one leaves."""
        tm = self.app.tm
        if not (tm.gracefully_exit or tm.server_status == tm.STARTING) and read_knobs().get("health_fail"):
            tm.server_status = tm.UNHEALTHY
            return True
        return False

    def health(self, _body):
        if self.health_failing():
            return self.send_body(503, b"", "text/plain")
        self.send_body(self.app.tm.health_generate(self.path.split("?", 1)[0]), b"", "text/plain")

    def ready(self, _body):
        self.health_failing()
        self.send_body(200 if self.app.tm.is_ready() else 503, b"", "text/plain")

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

    def loads(self, _body):
        include = self.query.get("include", [None])[0]
        include_set = {part.strip() for part in include.split(",")} if include else None
        if include_set is not None and not include_set <= LOAD_SECTIONS:
            return self.send_json(400, {"detail": f"Invalid include sections: {include_set - LOAD_SECTIONS}. "
                                                  f"Valid options: {sorted(LOAD_SECTIONS)}"})
        dp_rank = self.query.get("dp_rank", [None])[0]
        try:
            dp_rank = int(dp_rank) if dp_rank is not None else None
        except ValueError:
            return self.send_json(422, {"detail": [{"loc": ["query", "dp_rank"], "msg": "Input should be a valid integer",
                                                    "type": "int_parsing"}]})
        answer = self.app.loads(include_set, dp_rank)
        if self.query.get("format", [None])[0] != "prometheus":
            return self.send_json(200, answer)
        lines, samples = [], {}
        for load in answer["loads"]:  # v1_loads.py:62-94
            for key, value in load.items():
                if key == "dp_rank":
                    continue
                if isinstance(value, dict):
                    prefix = {"speculative": "spec", "disaggregation": "disagg"}.get(key, key)
                    for sub_key, sub_value in value.items():
                        if isinstance(sub_value, (int, float)):
                            samples.setdefault(f"sglang_{prefix}_{sub_key}", []).append((load["dp_rank"], sub_value))
                elif isinstance(value, (int, float)):
                    samples.setdefault(f"sglang_{key}", []).append((load["dp_rank"], value))
        for name, values in samples.items():
            lines.append(f"# TYPE {name} gauge")
            lines += [f'{name}{{dp_rank="{rank}"}} {value}' for rank, value in values]
        self.send_body(200, ("\n".join(lines) + "\n").encode(), "text/plain; version=0.0.4; charset=utf-8")

    def pieces(self, prompt: str, max_tokens: int):
        return self.app.tm.generate(prompt, max_tokens, len(prompt.split()), self.client_gone)

    def ddtree_refusal(self, rule, body: dict) -> str | None:
        """What a DDTree server refuses of this request (srt/request_rules.py); None elsewhere."""
        return rule(body) if self.app.args.speculative_algorithm == "DDTREE" else None

    def send_error_event(self, event: dict) -> None:
        """A stream of one error event and [DONE], after a 200 (0.5.23 serving_chat.py)."""
        self.start_stream()
        self.send_event(event)
        self.send_chunk(b"data: [DONE]\n\n")
        self.send_chunk(b"")

    def generate(self, body):
        if not self.app.serving:
            return self.send_json(503, {"error": "server is starting"})
        if (refusal := self.ddtree_refusal(request_rules.generate_refusal, body)) is not None:
            return self.send_json(400, request_rules.generate_error(refusal))
        prompt = str(body.get("text", ""))
        params = body.get("sampling_params") or {}
        texts, count = [], 0
        for text, count, _ in self.pieces(prompt, int(params.get("max_new_tokens", 16))):
            texts.append(text)
        meta = self.app.meta(prompt, count)
        meta["finish_reason"] = {"type": "length", "length": count}
        self.send_json(200, {"text": " ".join(texts), "meta_info": meta})

    def chat(self, body):
        """POST /v1/chat/completions as serving_chat.py answers it: a thinking request (the reasoning
        parser's default unless chat_template_kwargs turn it off) has its text split into
        reasoning_content and content; `model` echoes the request's."""
        if not self.app.serving:
            return self.send_json(503, {"error": "server is starting"})
        if (refusal := self.ddtree_refusal(request_rules.chat_refusal, body)) is not None:
            if body.get("stream"):
                return self.send_error_event(request_rules.chat_stream_error(refusal))
            return self.send_json(400, request_rules.chat_error(refusal))
        thinking = reasoning_parser.thinks(self.app.args.reasoning_parser, body.get("chat_template_kwargs"))
        separate = thinking and body.get("separate_reasoning", True)
        prompt = "\n".join(str(m.get("content", "")) for m in body.get("messages", []))
        prompt += reasoning_parser.THINK_START if thinking else ""
        max_tokens = int(body.get("max_completion_tokens") or body.get("max_tokens") or 16)
        answer = Answer("chatcmpl", prompt, body)
        pieces = self.pieces(prompt, max_tokens)
        if not body.get("stream"):
            text, meta = self.whole(prompt, pieces)
            reasoning, content = reasoning_parser.split(text) if separate else ("", text)
            return self.send_json(200, {
                **answer.head("chat.completion"),
                "choices": [{"index": 0, "message": {"role": "assistant", "content": content,
                                                     "reasoning_content": reasoning or None},
                             "logprobs": None, "finish_reason": FINISH_REASON, "matched_stop": None}],
                "usage": self.usage(meta), "metadata": None})
        # Chunks as _generate_chat_stream sends them (sse_utils.py StreamChunk: a delta always carries
        # reasoning_content, null where none): the role with empty content first, then each decode step's
        # reasoning or content, then a chunk with the finish reason alone; usage (choices []) only with
        # stream_options.include_usage.
        splitter = reasoning_parser.StreamSplitter() if separate else None
        count = 0
        for text, count, _finished in pieces:
            delta = " " + text if answer.started else text
            if not answer.started:
                self.start_stream()
                self.send_event(answer.chat_chunk({"role": "assistant", "content": ""}))
            answer.started += 1
            reasoning, content = splitter.feed(delta) if splitter else ("", delta)
            if reasoning:
                self.send_event(answer.chat_chunk({"reasoning_content": reasoning}))
            if content:
                self.send_event(answer.chat_chunk({"content": content}))
        self.send_event(answer.chat_chunk({}, finish_reason=FINISH_REASON))
        self.end_stream(answer, self.app.meta(prompt, count), "chat.completion.chunk")

    def completions(self, body):
        """POST /v1/completions as serving_completions.py answers it: the prompt's text continued, no
        chat template and no reasoning; streamed, each chunk one decode step's text, the last with the
        finish reason; usage (choices []) only with stream_options.include_usage."""
        if not self.app.serving:
            return self.send_json(503, {"error": "server is starting"})
        prompt = body.get("prompt", "")
        if not isinstance(prompt, str):
            return self.send_json(400, {"object": "error", "message": "the stand-in serves one prompt string",
                                        "type": "BadRequestError", "param": None, "code": 400})
        answer = Answer("cmpl", prompt, body)
        pieces = self.pieces(prompt, int(body.get("max_tokens") or 16))
        if not body.get("stream"):
            text, meta = self.whole(prompt, pieces)
            return self.send_json(200, {**answer.head("text_completion"),
                                        "choices": [answer.completion_choice(text, FINISH_REASON)],
                                        "usage": self.usage(meta), "metadata": None})
        count = 0
        for text, count, finished in pieces:
            delta = " " + text if answer.started else text
            if not answer.started:
                self.start_stream()
            answer.started += 1
            self.send_event({**answer.head("text_completion"), "usage": None,
                             "choices": [answer.completion_choice(delta, FINISH_REASON if finished else None)]})
        self.end_stream(answer, self.app.meta(prompt, count), "text_completion")

    def whole(self, prompt: str, pieces) -> tuple[str, dict]:
        texts, count = [], 0
        for text, count, _ in pieces:
            texts.append(text)
        return " ".join(texts), self.app.meta(prompt, count)

    def start_stream(self) -> None:
        """The 200 goes out with the first chunk (0.5.23 awaits it first), so a request no scheduler
        answers gets no status line at all."""
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        self.handler_returned()

    def send_event(self, event: dict) -> None:
        self.send_chunk(f"data: {json.dumps(event)}\n\n".encode())

    def end_stream(self, answer: "Answer", meta: dict, kind: str) -> None:
        if answer.include_usage:
            self.send_event({**answer.head(kind), "choices": [], "usage": self.usage(meta)})
        self.send_chunk(b"data: [DONE]\n\n")
        self.send_chunk(b"")

    @staticmethod
    def usage(meta: dict) -> dict:
        """protocol.py UsageInfo, as UsageProcessor fills it."""
        return {"prompt_tokens": meta["prompt_tokens"], "total_tokens": meta["prompt_tokens"] + meta["completion_tokens"],
                "completion_tokens": meta["completion_tokens"], "prompt_tokens_details": None,
                "reasoning_tokens": 0, "completion_tokens_details": None}

    def send_chunk(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    def update_weights_from_disk(self, body):
        # What the real tokenizer manager answers when the load fails: 400 with its message (http_server.py).
        self.send_json(400, {"success": False, "message": f"the stand-in loads no weights ({body.get('model_path')})",
                             "num_paused_requests": 0})

    def set_internal_state(self, _body):
        self.send_json(200, [{"updated": False, "server_args": {}}])

    def load_lora_adapter(self, body):
        self.send_json(400, {"success": False, "error_message": f"the stand-in loads no adapter ({body.get('lora_name')})"})

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
    ("GET", "/v1/loads"): Handler.loads,
    ("GET", "/metrics"): Handler.metrics,
    ("POST", "/generate"): Handler.generate,
    ("POST", "/v1/chat/completions"): Handler.chat,
    ("POST", "/v1/completions"): Handler.completions,
    ("POST", "/flush_cache"): Handler.flush_cache,
    ("POST", "/update_weights_from_disk"): Handler.update_weights_from_disk,
    ("POST", "/set_internal_state"): Handler.set_internal_state,
    ("PUT", "/set_internal_state"): Handler.set_internal_state,
    ("POST", "/load_lora_adapter"): Handler.load_lora_adapter,
}


def allowed(method: str, path: str, authorization: str | None, api_key: str | None, admin_api_key: str | None) -> bool:
    """utils/auth.py decide_request_auth (0.5.23) for the NORMAL and ADMIN_OPTIONAL routes: health, ready and
    metrics are open; an admin-optional route takes the admin key when one is set (the API key is then
    refused there), else the API key; every other route takes the API key alone. Refused: 401."""
    if method == "OPTIONS" or path.startswith(("/health", "/ready", "/metrics")):
        return True
    expected = (admin_api_key or api_key) if path in ADMIN_OPTIONAL else api_key
    if not expected:
        return True
    scheme, _, token = (authorization or "").partition(" ")
    return scheme.lower() == "bearer" and secrets.compare_digest(token, expected)


def local_gpus(args) -> list[int | None]:
    """Per TP rank of this node, the GPU (nvidia-smi index) it runs on: visible GPU base_gpu_id + rank *
    gpu_id_step (engine.py:931-961); None where CUDA shows no such GPU."""
    visible = query_gpu()["visible"]
    per_node = max(1, args.tp_size * args.pp_size // max(1, args.nnodes))
    ids = [args.base_gpu_id + rank * args.gpu_id_step for rank in range(per_node)]
    return [visible[i] if i < len(visible) else None for i in ids]


class DummyHealthHandler(BaseHTTPRequestHandler):
    """launch_dummy_health_check_server's FastAPI app (0.5.23 utils/common.py:3624-3680): a node of rank
    >= 1 answers 200 to its health routes whatever its schedulers do, and FastAPI's 404 to the rest."""

    server_version = "uvicorn"
    ROUTES = ("/ping", "/health", "/health_generate")  # GET, each answering an empty 200
    metrics = False

    def log_message(self, fmt, *args):  # uvicorn at log_level="warning": no access log
        pass

    def routed(self) -> bool:
        path = urllib.parse.urlsplit(self.path).path
        return path in self.ROUTES or (self.metrics and path == "/metrics")

    def answer(self, code: int, body: bytes, ctype: str = "application/json") -> None:
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        if self.routed():
            self.answer(200, b"", "text/plain")
        else:
            self.answer(404, b'{"detail":"Not Found"}')

    def do_POST(self):
        if self.routed():
            self.answer(405, b'{"detail":"Method Not Allowed"}')
        else:
            self.answer(404, b'{"detail":"Not Found"}')


def serve_other_node(args, config: dict, links: dict) -> None:
    """Node rank >= 1: schedulers only, until they exit (engine.py:1015-1029, 1262-1273)."""
    procs = engine.launch(args.tp_size, args.nnodes, args.node_rank, config, local_gpus(args))

    def stop_schedulers():
        for link in procs.peer_links:
            try:
                link.send(("shutdown",))
            except OSError:
                pass

    rendezvous.watch(links, on_shutdown=stop_schedulers)
    SignalLoop().add(signal.SIGTERM, lambda _signum: log(
        f"SIGTERM received on node_rank {args.node_rank}; waiting for the rank-0 ShutdownReq broadcast "
        "to stop the schedulers."))
    health = ThreadingHTTPServer((args.host, args.port), DummyHealthHandler)
    health.daemon_threads, DummyHealthHandler.metrics = True, bool(args.enable_metrics)
    threading.Thread(target=health.serve_forever, daemon=True).start()
    for process in procs.schedulers:
        process.join()
        log(f"Scheduler or DataParallelController {process.pid} terminated with {process.exitcode}")
    kill_process_tree(os.getpid(), include_parent=False)
    os._exit(0)


def main(argv: list[str]) -> None:
    args = prepare_server_args(argv)
    knobs = read_knobs()
    target_config = load_config(args.model_path)
    try:
        args.resolve_once()  # the real post-init rules (srt/resolution.py)
        args.check_server_args()  # and the checks the engine runs before it launches
    except Exception as exc:
        fail(f"{type(exc).__name__}: {exc}")
    config = scheduler_config(args, target_config)
    try:  # the real scheduler sizes its pool once the weights are loaded, and the server dies of an error there
        sized = kv_pool.startup(args, query_gpu()["memory_mib"])
    except Exception as exc:
        fail(f"{type(exc).__name__}: {exc}")
    config.update(max_total_num_tokens=sized.max_total_num_tokens, max_running_requests=sized.max_running_requests,
                  max_req_input_len=sized.max_req_input_len, context_len=sized.context_len)
    # One node: TP rank 0's scheduler holds the TCPStore (srt/distributed.py); several: node 0's dist-init port.
    config["store_port"] = distributed.store_port(args.nccl_port) if args.nnodes == 1 else None

    # Launch phase: SIGQUIT kills the tree (engine.py:1971-1982).
    signals = SignalLoop()

    def launch_phase_sigquit_handler(_signum):
        log("Received sigquit from a child process. It usually means the child failed.")
        kill_process_tree(os.getpid())
    signals.add(signal.SIGQUIT, launch_phase_sigquit_handler)
    links = {}
    if args.nnodes > 1:
        # Several nodes: rank 0 serves only once every rank joined; the others serve nothing.
        rendezvous.check_interfaces()
        if args.node_rank > 0:
            serve_other_node(args, config, {0: rendezvous.join(args)})
        links = rendezvous.gather(args)
        rendezvous.watch(links)

    procs = engine.launch(args.tp_size, args.nnodes, 0, config, local_gpus(args))
    tm = TokenizerManager(procs.to_scheduler, procs.receivers, procs.schedulers)
    signals.add(signal.SIGQUIT, tm.sigquit_handler)
    # The real watchdog starts once the schedulers are ready; before that a scheduler that fails
    # sends SIGQUIT itself, to the same end.
    tm.subprocess_watchdog = SubprocessWatchdog(*procs.processes)
    tm.subprocess_watchdog.start()

    app = Server(args, target_config, tm, config)
    Handler.app = app
    httpd = ThreadingHTTPServer((args.host, args.port), Handler)
    httpd.daemon_threads = True
    print(f"[lab stand-in sglang {sglang.__version__}] model={args.model_path} "
          f"speculative_algorithm={args.speculative_algorithm} "
          f"num_draft_tokens={args.speculative_num_draft_tokens} on {args.host}:{args.port}",
          flush=True)

    stop = {"reason": None, "force": False}

    def stop_http(reason: str) -> None:
        stop["reason"] = reason
        threading.Thread(target=httpd.shutdown, daemon=True).start()

    def graceful_end() -> None:
        if links:
            rendezvous.broadcast_shutdown(links)
        stop_http("drained")
    tm.stop_hook = graceful_end

    def warm_up():
        tm.schedulers_ready.wait()
        time.sleep(float(knobs.get("startup_delay_s", 0)))
        tm.start_running_phase()
        for _ in tm.generate(WARMUP_PROMPT, WARMUP_TOKENS, len(WARMUP_PROMPT.split())):
            pass
        tm.server_status = tm.UP
        app.serving = True
        print(READY_LINE, flush=True)
    threading.Thread(target=warm_up, daemon=True).start()

    def on_sigterm(signum, frame):
        if tm.running_phase:
            signals.post(tm.sigterm_handler, signum)
        else:  # no handler yet: the default action, the children follow by PR_SET_PDEATHSIG
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)

    def on_sigint(_signum):
        if stop["reason"] == "sigint":
            stop["force"] = True
        else:
            stop_http("sigint")
    signal.signal(signal.SIGTERM, on_sigterm)
    signals.add(signal.SIGINT, on_sigint)

    httpd.serve_forever()
    # uvicorn's shutdown: stop accepting, close idle connections, wait for the requests in flight.
    httpd.server_close()
    app.closing = True
    with app.lock:
        idle = [connection for connection, busy in app.connections.items() if not busy]
    for connection in idle:
        try:
            connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
    while app.http_in_flight and not stop["force"]:
        time.sleep(0.1)
    kill_process_tree(os.getpid(), include_parent=False)  # launch_server.py:83-86
    if stop["reason"] == "sigint":
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(1)
    os._exit(0)


if __name__ == "__main__":
    try:
        main(sys.argv[1:])
    finally:
        kill_process_tree(os.getpid(), include_parent=False)  # launch_server.py:83-86
