"""The lab's SGLang stand-in checked against SGLang 0.5.23's own code (no lab, no GPU).

The same requests go to a local stand-in (a Kimi K2.6 profile: DFLASH, --reasoning-parser kimi_k2,
metrics, an API key), and its answers go to the real wheel's serving code
(tests/sglang_conformance_real.py in the env of tests/sglang_real.py), compared field by field:
- chat and text completions, whole: equal to the real protocol model's serialization of them
  (ChatCompletionResponse, CompletionResponse: every field the real server sends, nulls included);
- stream chunks: each equal to what the real server builds from its values (sse_utils.build_sse_content
  for chat deltas, the protocol models for usage chunks and completion chunks), in the real order:
  the role with empty content first, content-only (or reasoning-only) deltas, the finish reason in a
  chunk of its own (chat), a usage chunk with choices [] only with stream_options.include_usage, [DONE];
- thinking: the real ReasoningParser("kimi_k2", force_reasoning=True) splits the stand-in's raw text
  (its /generate answer to the prompt the chat server builds) as the stand-in's reasoning_content and
  content, whole and streamed;
- /server_info: its keys are the real ServerArgs' fields plus what build_server_info and the route add;
- /metrics: every series the stand-in exposes is a metric of the real collectors, with their label names;
- /health and /health_generate: one handler in the real server and in the stand-in.
"""

import http.client
import json
import re
from pathlib import Path

import pytest

from tests.lab_code.test_sglang_standin import STANDIN_SRC, Standin, dflash_args, write_models
from tests.sglang_real import ENV_DIR, run_with_real_sglang

REAL_SCRIPT = Path(__file__).resolve().parents[1] / "sglang_conformance_real.py"
KEY = "conformance-key"
ASK = [{"role": "user", "content": "In one sentence, what is speculative decoding?"}]
CHATS = {  # what each request asks for
    "thinking, short": {"model": "kimi-k2.6", "messages": ASK, "max_tokens": 32},
    "thinking, past its reasoning": {"model": "kimi-k2.6", "messages": ASK, "max_tokens": 64},
    "not thinking": {"model": "kimi-k2.6", "messages": ASK, "max_tokens": 12,
                     "chat_template_kwargs": {"thinking": False}},
    "no model named": {"messages": ASK, "max_tokens": 4, "chat_template_kwargs": {"thinking": False}},
}
STREAMS = {
    "thinking, past its reasoning, usage": {**CHATS["thinking, past its reasoning"],
                                            "stream_options": {"include_usage": True}},
    "not thinking, no usage": CHATS["not thinking"],
}
COMPLETIONS = {"plain": {"model": "kimi-k2.6", "prompt": "The capital city of France is", "max_tokens": 9}}
# What build_server_info and the /server_info route add to the resolved arguments (utils/common.py,
# managers/scheduler.py get_init_info, entrypoints/http_server.py server_info); and the lab's own figure.
SERVER_INFO_EXTRA = {"launch_command", "status", "max_total_num_tokens", "max_req_input_len", "startup_time",
                     "hicache_object_layout", "kv_events", "internal_states", "version", "frontend"}
LAB_ONLY = {"lab_speed_model"}
FINISH_REASONS = {"stop", "length", "tool_calls", "abort"}


def post(port: int, path: str, body: dict) -> tuple[int, bytes]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=20)
    connection.request("POST", path, json.dumps(body), {"Authorization": f"Bearer {KEY}",
                                                        "Content-Type": "application/json"})
    response = connection.getresponse()
    data = response.read()
    connection.close()
    return response.status, data


def events(data: bytes) -> list:
    """The data lines of a stream, [DONE] as the string it is."""
    return [line[6:] if line == "data: [DONE]" else json.loads(line[6:])
            for line in data.decode().splitlines() if line.startswith("data: ")]


@pytest.fixture(scope="module")
def answers(tmp_path_factory, request):
    tmp = tmp_path_factory.mktemp("conformance")
    target, draft = write_models(tmp / "kimi", tmp / "kimi-dflash")
    (tmp / "knobs.json").write_text("{}")
    gpu = request.getfixturevalue("b200_gpu_module")
    s = Standin(STANDIN_SRC, dflash_args((target, draft), "--enable-metrics", "--api-key", KEY,
                                         "--served-model-name", "kimi-k2.6", "--reasoning-parser", "kimi_k2",
                                         "--tool-call-parser", "kimi_k2"), tmp / "knobs.json", env=gpu)
    try:
        s.wait_ready()
        got = {"chat": {name: json.loads(post(s.port, "/v1/chat/completions", body)[1])
                        for name, body in CHATS.items()},
               "chat_streams": {name: events(post(s.port, "/v1/chat/completions", {**body, "stream": True})[1])
                                for name, body in STREAMS.items()},
               "completions": {name: json.loads(post(s.port, "/v1/completions", body)[1])
                               for name, body in COMPLETIONS.items()},
               "completion_streams": {
                   name: events(post(s.port, "/v1/completions", {**COMPLETIONS["plain"], "stream": True, **usage})[1])
                   for name, usage in (("plain", {}), ("plain, usage", {"stream_options": {"include_usage": True}}))},
               # What the model generated for the thinking requests: the chat server's prompt (the messages,
               # then <think>) through /generate, which parses nothing.
               "raw": {name: json.loads(post(s.port, "/generate", {
                   "text": ASK[0]["content"] + "<think>",
                   "sampling_params": {"max_new_tokens": CHATS[name]["max_tokens"]}})[1])["text"]
                   for name in ("thinking, short", "thinking, past its reasoning")},
               "server_info": json.loads(s.get("/server_info", key=KEY)[1]),
               "metrics": s.get("/metrics")[1],
               "health": (s.get("/health")[0], s.get("/health_generate")[0])}
    finally:
        s.stop()
    return got


@pytest.fixture(scope="module")
def b200_gpu_module(tmp_path_factory):
    from tests.gpu_standin_env import gpu_standin_env
    return gpu_standin_env(tmp_path_factory.mktemp("gpu"), "b200_nvlink")


@pytest.fixture(scope="module")
def real(answers):
    """SGLang's own verdicts on the stand-in's answers (one run of the real env, ~30 s: torch's import)."""
    streams = {name: [e for e in stream if e != "[DONE]"] for name, stream in answers["chat_streams"].items()}
    completion = {name: [e for e in stream if e != "[DONE]"] for name, stream in answers["completion_streams"].items()}
    verdict = run_with_real_sglang(REAL_SCRIPT, {
        "chat": list(answers["chat"].values()), "completions": list(answers["completions"].values()),
        "chat_streams": list(streams.values()), "completion_streams": list(completion.values()),
        "reasoning": [{"parser": "kimi_k2", "deltas": re.split(r"(?= )", raw)} for raw in answers["raw"].values()],
    })
    verdict["chat"] = dict(zip(answers["chat"], verdict["chat"]))
    verdict["completions"] = dict(zip(answers["completions"], verdict["completions"]))
    verdict["chat_streams"] = dict(zip(streams, verdict["chat_streams"]))
    verdict["completion_streams"] = dict(zip(completion, verdict["completion_streams"]))
    verdict["reasoning"] = dict(zip(answers["raw"], verdict["reasoning"]))
    return verdict


def as_sglang_sends(stand_in, verdict) -> None:
    assert "error" not in verdict, verdict["error"]
    assert stand_in == verdict["ok"]


@pytest.mark.parametrize("name", CHATS)
def test_a_chat_completion_is_what_sglang_sends(answers, real, name):
    as_sglang_sends(answers["chat"][name], real["chat"][name])
    assert answers["chat"][name]["model"] == CHATS[name].get("model", "default")  # the request's, echoed


@pytest.mark.parametrize("name", COMPLETIONS)
def test_a_text_completion_is_what_sglang_sends(answers, real, name):
    as_sglang_sends(answers["completions"][name], real["completions"][name])


@pytest.mark.parametrize("name", STREAMS)
def test_chat_stream_chunks_are_what_sglang_sends_in_its_order(answers, real, name):
    stream = answers["chat_streams"][name]
    for chunk, verdict in zip(stream, real["chat_streams"][name]):
        as_sglang_sends(chunk, verdict)
    assert stream[-1] == "[DONE]"
    usage = bool(STREAMS[name].get("stream_options", {}).get("include_usage"))
    body = stream[:-2] if usage else stream[:-1]
    if usage:  # the usage chunk: no choices, the tokens counted
        assert stream[-2]["choices"] == [] and stream[-2]["usage"]["completion_tokens"] == STREAMS[name]["max_tokens"]
    assert all("usage" not in chunk for chunk in body)
    first, *deltas, finish = body
    assert first["choices"][0]["delta"] == {"reasoning_content": None, "role": "assistant", "content": ""}
    assert deltas and all("role" not in c["choices"][0]["delta"] and c["choices"][0]["finish_reason"] is None
                          and bool(c["choices"][0]["delta"].get("content")) !=
                          bool(c["choices"][0]["delta"]["reasoning_content"]) for c in deltas)
    assert finish["choices"][0]["delta"] == {"reasoning_content": None}
    assert finish["choices"][0]["finish_reason"] in FINISH_REASONS
    assert {c["model"] for c in body} == {STREAMS[name]["model"]}


@pytest.mark.parametrize("name", ["plain", "plain, usage"])
def test_text_completion_stream_chunks_are_what_sglang_sends_in_its_order(answers, real, name):
    stream = answers["completion_streams"][name]
    for chunk, verdict in zip(stream, real["completion_streams"][name]):
        as_sglang_sends(chunk, verdict)
    assert stream[-1] == "[DONE]"
    body = stream[:-2] if "usage" in name else stream[:-1]
    if "usage" in name:
        assert stream[-2]["choices"] == [] and stream[-2]["usage"]["completion_tokens"] == 9
    assert all(chunk["usage"] is None for chunk in body)
    assert [c["choices"][0]["finish_reason"] for c in body] == [None] * (len(body) - 1) + ["length"]
    whole = answers["completions"]["plain"]["choices"][0]["text"]
    assert "".join(c["choices"][0]["text"] for c in body) == whole


@pytest.mark.parametrize("name", ["thinking, short", "thinking, past its reasoning"])
def test_the_thinking_answer_splits_as_the_real_reasoning_parser_splits_it(answers, real, name):
    message = answers["chat"][name]["choices"][0]["message"]
    reasoning, content = real["reasoning"][name]["whole"]
    assert (message["reasoning_content"], message["content"]) == (reasoning or None, content or "")
    assert real["reasoning"][name]["stream"] == [reasoning, content]
    if name == "thinking, past its reasoning":  # streamed too
        stream = [c for c in answers["chat_streams"][f"{name}, usage"] if c != "[DONE]" and c["choices"]]
        assert "".join(c["choices"][0]["delta"].get("reasoning_content") or "" for c in stream) == reasoning
        assert "".join(c["choices"][0]["delta"].get("content") or "" for c in stream) == content
    if name == "thinking, short":  # what a short probe of a thinking model sees: no content at all
        assert message["content"] == "" and reasoning


def test_server_info_holds_what_the_real_one_holds_the_key_included(answers, real):
    info = answers["server_info"]
    assert set(info) - LAB_ONLY == set(real["server_args_fields"]) | SERVER_INFO_EXTRA
    assert info["api_key"] == KEY and f"--api-key {KEY}" in info["launch_command"]
    assert info["max_total_num_tokens"] > 0


def test_metrics_are_the_real_collectors_with_their_labels(answers, real):
    series = [line for line in answers["metrics"].splitlines() if line and not line.startswith("#")]
    assert series
    for line in series:
        name, labels = re.match(r"([^{ ]+)(?:\{([^}]*)\})? ", line).groups()
        assert name in real["metrics"], f"{name}: no such metric in the real collectors"
        assert sorted(re.findall(r'(\w+)="', labels or "")) == real["metrics"][name], line


def test_health_and_health_generate_are_one_handler_as_in_the_real_server(answers):
    real_source = next((ENV_DIR / "lib").glob("python3*/site-packages/sglang/srt/entrypoints/http_server.py"))
    assert '@app.get("/health")\n@app.get("/health_generate")\nasync def health_generate' in real_source.read_text()
    routes = (STANDIN_SRC / "sglang" / "launch_server.py").read_text()
    assert '("GET", "/health"): Handler.health,' in routes and '("GET", "/health_generate"): Handler.health,' in routes
    assert answers["health"] == (200, 200)


def test_a_rank_above_0_serves_the_real_dummy_health_servers_routes():
    """0.5.23 utils/common.py launch_dummy_health_check_server, read from the wheel: the GET routes a
    node of rank >= 1 answers, each 200 with no body, are the stand-in's."""
    import ast
    real_source = next((ENV_DIR / "lib").glob("python3*/site-packages/sglang/srt/utils/common.py"))
    (function,) = [node for node in ast.walk(ast.parse(real_source.read_text()))
                   if isinstance(node, ast.FunctionDef) and node.name == "launch_dummy_health_check_server"]
    real_routes = [decorator.args[0].value for node in ast.walk(function) if isinstance(node, ast.AsyncFunctionDef)
                   for decorator in node.decorator_list
                   if isinstance(decorator, ast.Call) and decorator.func.attr == "get"]
    assert all("Response(status_code=200)" in ast.unparse(node) for node in ast.walk(function)
               if isinstance(node, ast.AsyncFunctionDef))
    standin = ast.parse((STANDIN_SRC / "sglang" / "launch_server.py").read_text())
    (handler,) = [node for node in ast.walk(standin) if isinstance(node, ast.ClassDef)
                  and node.name == "DummyHealthHandler"]
    (routes,) = [ast.literal_eval(node.value) for node in handler.body if isinstance(node, ast.Assign)
                 and [ast.unparse(t) for t in node.targets] == ["ROUTES"]]
    assert tuple(real_routes) == routes
