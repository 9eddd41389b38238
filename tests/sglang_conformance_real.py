"""Runs in the REAL SGLang 0.5.23 env (tests/sglang_real.py run_with_real_sglang): SGLang's own code judges
what the lab's stand-in answered. Reads the stand-in's answers as JSON on stdin; prints one line
@@RESULT@@{...}: per answer, SGLang's serialization of it (what the real server would send with
those values) or the error its protocol model raised, the real reasoning parser's split of the
stand-in's raw text, the real ServerArgs' field names, and the real collectors' metric names with
their label names.
"""

import json
import sys

from prometheus_client import REGISTRY

from sglang.srt.entrypoints.openai import protocol
from sglang.srt.entrypoints.openai.sse_utils import build_sse_content
from sglang.srt.observability.http_request_metrics import _HttpRequestMetrics
from sglang.srt.observability.metrics_collector import SchedulerMetricsCollector, TokenizerMetricsCollector
from sglang.srt.parser.reasoning_parser import ReasoningParser
from sglang.srt.server_args import ServerArgs, record_fields


def dumped(model, body: dict):
    """What the real server sends for `body`'s values: FastAPI's model_dump of a response, or the error."""
    try:
        return {"ok": json.loads(model.model_validate(body).model_dump_json())}
    except Exception as error:  # pydantic's ValidationError, in full
        return {"error": str(error)}


def chat_chunk(chunk: dict):
    """A chat stream chunk as SGLang builds it: sse_utils.build_sse_content for a delta or a finish (msgspec),
    ChatCompletionStreamResponse.model_dump_json for the usage chunk (choices [])."""
    if not chunk.get("choices"):
        return dumped(protocol.ChatCompletionStreamResponse, chunk)
    try:
        (choice,) = chunk["choices"]
        delta = choice["delta"]
        text = build_sse_content(chunk_id=chunk["id"], created=chunk["created"], model=chunk["model"],
                                 index=choice["index"], role=delta.get("role"), content=delta.get("content"),
                                 reasoning_content=delta["reasoning_content"],
                                 finish_reason=choice["finish_reason"], logprobs=choice["logprobs"],
                                 matched_stop=choice["matched_stop"], usage=chunk.get("usage"))
        protocol.ChatCompletionStreamResponse.model_validate(chunk)
        return {"ok": json.loads(text.removeprefix("data: "))}
    except Exception as error:
        return {"error": f"{type(error).__name__}: {error}"}


def reasoning(case: dict) -> dict:
    """The real parser's split of a thinking answer, whole (serving_chat's non-stream path) and streamed
    one decode step at a time (its stream path), as serving_chat runs it for a thinking request."""
    whole = ReasoningParser(case["parser"], stream_reasoning=False, force_reasoning=True)
    streamed = ReasoningParser(case["parser"], stream_reasoning=True, force_reasoning=True)
    reasoning_text, content = "", ""
    for delta in case["deltas"]:
        r, c = streamed.parse_stream_chunk(delta)
        reasoning_text, content = reasoning_text + (r or ""), content + (c or "")
    r, c = streamed.parse_stream_end()
    return {"whole": list(whole.parse_non_stream("".join(case["deltas"]))),
            "stream": [reasoning_text + (r or ""), content + (c or "")]}


def metric_labels() -> dict:
    """Every metric the real collectors register, exposed name -> label names, with the labels the real
    server gives them (metrics_collector.py: tokenizer_metric_labels, the scheduler's rank labels)."""
    tokenizer = {"model_name": "m", "engine_type": "unified"}
    for make in (lambda: TokenizerMetricsCollector(labels=tokenizer),
                 lambda: SchedulerMetricsCollector(labels={**tokenizer, "tp_rank": 0, "pp_rank": 0, "moe_ep_rank": 0},
                                                   server_args=None),
                 _HttpRequestMetrics):
        try:
            make()
        except Exception:  # a metric after a runtime-config read is not registered; those before it are
            pass
    names = {}
    for collector in set(REGISTRY._names_to_collectors.values()):
        name = getattr(collector, "_name", "")
        if name.startswith("sglang:"):
            exposed = name + "_total" if collector._type == "counter" else name
            names[exposed] = sorted(collector._labelnames)
    return names


def main() -> None:
    answers = json.load(sys.stdin)
    result = {
        "chat": [dumped(protocol.ChatCompletionResponse, a) for a in answers["chat"]],
        "completions": [dumped(protocol.CompletionResponse, a) for a in answers["completions"]],
        "chat_streams": [[chat_chunk(c) for c in stream] for stream in answers["chat_streams"]],
        "completion_streams": [[dumped(protocol.CompletionStreamResponse, c) for c in stream]
                               for stream in answers["completion_streams"]],
        "reasoning": [reasoning(case) for case in answers["reasoning"]],
        "server_args_fields": sorted(f.name for f in record_fields(ServerArgs)),
        "metrics": metric_labels(),
    }
    print("@@RESULT@@" + json.dumps(result))


if __name__ == "__main__":
    main()
