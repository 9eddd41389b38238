"""Every replica's server generates, speculatively: health, a chat completion, /server_info, /metrics; its
engine holds the KV tokens its deploy planned (the plan kept beside its unit: operations/server/capacity_record.py).

Asked from the host itself (python3, stdlib); an API key, if the deploy installed one,
is read there from its 0600 file and never appears in a command line.
"""

import ipaddress
import json

import pytest

from deployment.server import capacity
from operations.server import capacity_record
from operations.server.host_scripts.engine_answers import generated, scrubbed

_SERVING_SCRIPT = r"""
import json, os, sys, urllib.error, urllib.request
base, model, key_file, plan_file = sys.argv[1:5]
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
result["kv_plan"] = open(plan_file).read() if os.path.isfile(plan_file) else None
print(json.dumps(result))
"""


@pytest.fixture(autouse=True)
def http_server(target):
    if not target.serves_http:
        pytest.skip("rank >= 1 of a node group serves no model: its group serves at rank 0 "
                    "(tests/deployed/test_multinode.py)")


def base_url(d) -> str:
    address = ipaddress.ip_address(d.engine.service.bind_address)
    if address.is_unspecified:
        address = ipaddress.ip_address("::1" if address.version == 6 else "127.0.0.1")
    host = f"[{address}]" if address.version == 6 else str(address)
    return f"http://{host}:{d.port}"


def serving(target, d) -> dict:
    return target.memo(f"serving {d.service_name}", lambda: target.python(
        _SERVING_SCRIPT, base_url(d), d.engine.served_model_name, d.engine.service.api_key_file,
        capacity_record.path(d)))


def each_replica(target, check) -> None:
    """Run `check(replica, what it answered)` on every replica; fail with every replica's problem."""
    problems = [problem for d in target.replicas for problem in check(d, serving(target, d))]
    assert not problems, "\n".join(problems)


def body_json(target, name: str, response: dict) -> tuple[object, str | None]:
    """(the JSON body, None) of a 200 response, else (None, why not)."""
    if response["status"] != 200:
        return None, f"expected 200 from {name}, found {response['status']}: {scrubbed(response['body'][:300])}"
    try:
        return json.loads(response["body"]), None
    except ValueError:
        return None, f"expected JSON from {name}, found {scrubbed(response['body'][:300])!r}"


def test_health_generate_answers_200(target):
    def check(d, answers):
        health = answers["health"]
        return [] if health["status"] == 200 else [
            f"{target.name}: expected 200 from /health_generate on {base_url(d)} ({d.service_name}), found "
            f"{health['status']}: {health['body'][:300]}"]
    each_replica(target, check)


def test_chat_completion_returns_text(target):
    """Generated: tokens counted and text, in content or (a thinking model's short answer) reasoning_content."""
    def check(d, answers):
        chat, problem = body_json(target, "/v1/chat/completions", answers["chat"])
        if problem:
            return [f"{target.name}: {d.service_name}: {problem}"]
        return [] if generated(chat) else [
            f"{target.name}: expected a chat completion from {d.engine.served_model_name} ({d.service_name}) that "
            f"generated (usage.completion_tokens > 0, text in content or reasoning_content), found "
            f"{json.dumps(scrubbed(chat))[:300]}"]
    each_replica(target, check)


def test_server_info_reports_speculative_decoding_accepting_drafts(target):
    def check(d, answers):
        info, problem = body_json(target, "/server_info", answers["server_info"])
        if problem:
            return [f"{target.name}: {d.service_name}: {problem}"]
        problems = []
        entry = d.engine.speculative.entry
        drafts = entry.drafts
        algorithm, expected = info.get("speculative_algorithm"), entry.sglang_name if drafts else None
        if algorithm != expected:  # SGLang's is None without speculation
            problems.append(f"{target.name}: expected {d.service_name}'s /server_info speculative_algorithm "
                            f"{expected}, found {algorithm}")
        spec = d.engine.speculative
        settings = {"speculative_num_draft_tokens": spec.num_draft_tokens,
                    **{f"speculative_{key}": value for key, value in spec.values.items()}} if drafts else {}
        served = {key: info.get(key) for key in settings}
        if served != settings:  # the engine serves the settings its profile says, none moved by its resolution
            problems.append(f"{target.name}: expected {d.service_name}'s /server_info to report {settings}, found "
                            f"{served}")
        if info.get("tp_size") != d.engine.tp_size or info.get("port") != d.port:
            problems.append(f"{target.name}: expected {d.service_name} at TP {d.engine.tp_size} on port {d.port}, found "
                            f"TP {info.get('tp_size')} on port {info.get('port')}")
        accept = (info.get("internal_states") or [{}])[0].get("avg_spec_accept_length")
        if drafts and not (isinstance(accept, (int, float)) and accept > 1.0):
            problems.append(f"{target.name}: expected an average accept length > 1.0 in {d.service_name}'s "
                            f"/server_info, found {accept}: the drafter's tokens are not being accepted")
        return problems
    each_replica(target, check)


def test_each_replicas_engine_holds_the_kv_tokens_its_deploy_planned(target):
    """/server_info's max_total_num_tokens, the pool the engine sized once loaded, is no more than
    capacity.ENGINE_TOLERANCE below the plan the deploy kept on the host (a model the planner cannot size
    has none)."""
    if all(serving(target, d)["kv_plan"] is None for d in target.replicas):
        pytest.skip(f"{target.name}: no KV plan beside any unit: the planner has no rule for the model, or "
                    "no deploy of this checkout wrote one")

    def check(d, answers):
        if answers["kv_plan"] is None:
            return []
        info, problem = body_json(target, "/server_info", answers["server_info"])
        if problem:
            return [f"{target.name}: {d.service_name}: {problem}"]
        engine = info.get("max_total_num_tokens")
        if not isinstance(engine, int):
            return [f"{target.name}: expected max_total_num_tokens in {d.service_name}'s /server_info, found "
                    f"{engine!r}"]
        short = capacity.engine_shortfall(d.service_name, capacity_record.planned_tokens(answers["kv_plan"]), engine)
        return [f"{target.name}: {short} ({capacity_record.path(d)})"] if short else []
    each_replica(target, check)


def test_metrics_expose_the_accept_length(target):
    if not target.deployment.host.service.enable_metrics:
        pytest.skip("enable_metrics is off in group_data")

    def check(d, answers):
        metrics = answers["metrics"]
        if metrics["status"] != 200:
            return [f"{target.name}: expected 200 from {d.service_name}'s /metrics (enable_metrics is on), found "
                    f"{metrics['status']}: {metrics['body'][:300]}"]
        if not d.engine.speculative.entry.drafts:  # no speculation: no accept length to expose
            return []
        lines = [line for line in metrics["body"].splitlines() if line.startswith("sglang:spec_accept_length")]
        return [] if lines else [f"{target.name}: expected sglang:spec_accept_length in {d.service_name}'s "
                                 f"/metrics, found {len(metrics['body'].splitlines())} lines without it"]
    each_replica(target, check)
