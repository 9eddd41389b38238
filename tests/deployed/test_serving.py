"""The server generates, speculatively: health, a chat completion, /server_info, /metrics.

Asked from the host itself (python3, stdlib); an API key, if the deploy installed one,
is read there from its 0600 file and never appears in a command line.
"""

import ipaddress
import json

import pytest

_SERVING_SCRIPT = r"""
import json, os, sys, urllib.error, urllib.request
base, model, key_file = sys.argv[1:4]
headers = {"Content-Type": "application/json"}
if os.path.isfile(key_file):
    headers["Authorization"] = "Bearer " + open(key_file).read().strip()
def call(path, body=None, timeout=60):
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(base + path, data=data, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return {"status": response.status, "body": response.read().decode(errors="replace")}
    except urllib.error.HTTPError as error:
        return {"status": error.code, "body": error.read().decode(errors="replace")[:500]}
    except (urllib.error.URLError, OSError) as error:
        return {"status": None, "body": str(error)[:500]}
result = {"health": call("/health_generate", timeout=120)}
result["chat"] = call("/v1/chat/completions", {
    "model": model, "max_tokens": 32,
    "messages": [{"role": "user", "content": "In one sentence, what is speculative decoding?"}]}, timeout=300)
result["server_info"] = call("/server_info")
result["metrics"] = call("/metrics")
print(json.dumps(result))
"""


@pytest.fixture(autouse=True)
def http_server(target):
    if not target.serves_http:
        pytest.skip("rank >= 1 of a node group runs no HTTP server: its group serves at rank 0 "
                    "(tests/deployed/test_multinode.py)")


def base_url(d) -> str:
    address = ipaddress.ip_address(d.bind_address)
    if address.is_unspecified:
        address = ipaddress.ip_address("::1" if address.version == 6 else "127.0.0.1")
    host = f"[{address}]" if address.version == 6 else str(address)
    return f"http://{host}:{d.port}"


def serving(target) -> dict:
    d = target.deployment.server
    return target.memo("serving", lambda: target.python(_SERVING_SCRIPT, base_url(d), d.served_model_name,
                                                        d.api_key_file))


def body_json(target, name: str, response: dict):
    assert response["status"] == 200, (f"{target.name}: expected 200 from {name}, found "
                                       f"{response['status']}: {response['body'][:300]}")
    try:
        return json.loads(response["body"])
    except ValueError:
        pytest.fail(f"{target.name}: expected JSON from {name}, found {response['body'][:300]!r}")


def test_health_generate_answers_200(target):
    health = serving(target)["health"]
    assert health["status"] == 200, (f"{target.name}: expected 200 from /health_generate on "
                                     f"{base_url(target.deployment.server)}, found {health['status']}: "
                                     f"{health['body'][:300]}")


def test_chat_completion_returns_text(target):
    chat = body_json(target, "/v1/chat/completions", serving(target)["chat"])
    try:
        text = chat["choices"][0]["message"]["content"]
    except (KeyError, IndexError, TypeError):
        text = None
    assert isinstance(text, str) and text.strip(), (
        f"{target.name}: expected a chat completion from {target.deployment.server.served_model_name} with text, "
        f"found {str(chat)[:300]}")


def test_server_info_reports_speculative_decoding_accepting_drafts(target):
    d = target.deployment.server
    info = body_json(target, "/server_info", serving(target)["server_info"])
    algorithm = info.get("speculative_algorithm")
    assert algorithm == d.speculative.algorithm, (
        f"{target.name}: expected /server_info speculative_algorithm {d.speculative.algorithm}, found {algorithm}")
    states = info.get("internal_states") or [{}]
    accept = states[0].get("avg_spec_accept_length")
    assert isinstance(accept, (int, float)) and accept > 1.0, (
        f"{target.name}: expected an average accept length > 1.0 in /server_info, found {accept}: "
        "the drafter's tokens are not being accepted")


def test_metrics_expose_the_accept_length(target):
    d = target.deployment.server
    if not d.enable_metrics:
        pytest.skip("enable_metrics is off in group_data")
    metrics = serving(target)["metrics"]
    assert metrics["status"] == 200, (f"{target.name}: expected 200 from /metrics (enable_metrics is on), "
                                      f"found {metrics['status']}: {metrics['body'][:300]}")
    lines = [line for line in metrics["body"].splitlines() if line.startswith("sglang:spec_accept_length")]
    assert lines, (f"{target.name}: expected sglang:spec_accept_length in /metrics, found "
                   f"{len(metrics['body'].splitlines())} lines without it")
