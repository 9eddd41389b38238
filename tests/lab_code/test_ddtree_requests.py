"""The requests a DDTree server refuses (grammar-constrained, logprobs), answered as SGLang answers a
refusal; and the product itself never asks for them."""

import ast
import http.client
import json
import runpy
from pathlib import Path

import pytest

from tests.lab_code.test_sglang_standin import (STANDIN_SRC, b200_gpu, ddtree_src, dflash_args, models,  # noqa: F401
                                                start)

REPO = Path(__file__).resolve().parents[2]
RULES = runpy.run_path(str(STANDIN_SRC / "sglang" / "srt" / "request_rules.py"))
CHAT = {"model": "x", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}
TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
REFUSED_CHATS = {
    "logprobs": ({"logprobs": True, "top_logprobs": 2}, RULES["LOGPROBS"]),
    "json schema": ({"response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": {}}}},
                    RULES["GRAMMAR"]),
    "json object": ({"response_format": {"type": "json_object"}}, RULES["GRAMMAR"]),
    "required tool": ({"tools": TOOLS, "tool_choice": "required"}, RULES["GRAMMAR"]),
    "named tool": ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "f"}}},
                   RULES["GRAMMAR"]),
    "regex": ({"regex": "a+"}, RULES["GRAMMAR"]),
}
SERVED_CHATS = {"plain": {}, "auto tools": {"tools": TOOLS, "tool_choice": "auto"},
                "text format": {"response_format": {"type": "text"}}}


@pytest.fixture
def ddtree(start, models, ddtree_src):
    s = start(dflash_args(models) + ["--speculative-algorithm", "DDTREE", "--attention-backend", "triton"],
              src=ddtree_src)
    s.wait_ready()
    return s


def post_stream(port: int, body: dict) -> tuple[int, list[str]]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    connection.request("POST", "/v1/chat/completions", json.dumps(body))
    response = connection.getresponse()
    lines = [line for line in response.read().decode().splitlines() if line.startswith("data: ")]
    connection.close()
    return response.status, lines


def test_ddtree_refuses_grammar_and_logprobs_as_sglang_answers_a_refusal(ddtree):
    """Non-streamed: 400 and serving_base's ErrorResponse; streamed: 200, one error event, [DONE];
    /generate: 400 and http_server's {"error": {"message"}}. What it serves, it serves."""
    for name, (extra, message) in REFUSED_CHATS.items():
        code, body = ddtree.get("/v1/chat/completions", {**CHAT, **extra})
        assert (code, json.loads(body)) == (400, {"object": "error", "message": message, "type": "BadRequest",
                                                  "param": None, "code": 400}), name
        status, lines = post_stream(ddtree.port, {**CHAT, **extra, "stream": True})
        assert status == 200 and lines[-1] == "data: [DONE]" and len(lines) == 2, name
        assert json.loads(lines[0][6:]) == {"error": {"object": "error", "message": message, "type": "BAD_REQUEST",
                                                      "param": None, "code": 400}}, name
    for name, extra in SERVED_CHATS.items():
        code, body = ddtree.get("/v1/chat/completions", {**CHAT, **extra})
        assert code == 200 and json.loads(body)["usage"]["completion_tokens"] == 5, name
    generate = {"text": "hi", "sampling_params": {"max_new_tokens": 4}}
    assert ddtree.get("/generate", {**generate, "return_logprob": True}) == (
        400, json.dumps({"error": {"message": RULES["LOGPROBS"]}}))
    assert ddtree.get("/generate", {**generate, "sampling_params": {"max_new_tokens": 4, "regex": "a+"}}) == (
        400, json.dumps({"error": {"message": RULES["GRAMMAR"]}}))
    assert ddtree.get("/generate", generate)[0] == 200


def test_dflash_serves_what_ddtree_refuses(start, models):
    """0.5.23's DFLASH refuses only return_hidden_states (speculative/dflash_utils.py validate_dflash_request)."""
    s = start(dflash_args(models))
    s.wait_ready()
    for name, (extra, _) in REFUSED_CHATS.items():
        assert s.get("/v1/chat/completions", {**CHAT, **extra})[0] == 200, name


# The product's own requests: probes, checks, the bench, the demo.
PRODUCT = ["deployment", "operations", "serving_benchmark", "tests/deployed", "bench.py", "deploy.py", "rollout.py"]


def test_the_product_never_asks_for_what_ddtree_refuses():
    """No request the product builds names a key that asks for logprobs or a grammar (the string
    literals of its sources, dict keys included)."""
    asked = []
    for root in PRODUCT:
        path = REPO / root
        for source in ([path] if path.is_file() else sorted(path.rglob("*.py"))):
            for node in ast.walk(ast.parse(source.read_text())):
                if isinstance(node, ast.Constant) and node.value in RULES["REFUSED_KEYS"]:
                    asked.append(f"{source.relative_to(REPO)}:{node.lineno} {node.value!r}")
    assert asked == []
