"""LAB STAND-IN for the requests a DDTree server refuses (PR #29907), and how SGLang answers a refusal.

The PR's DDTreeWorker raises on a batch with grammar constraints or `return_logprob` ("scheduler
should have rejected this request", speculative/ddtree_worker.py at 93e9850e4): the scheduler's
DFlash-family check refuses them first, with the messages of 0.5.16's validate_dflash_request
(speculative/dflash_utils.py), the last release whose check still refused them. A refusal aborts
the request with status 400 (managers/schedule_batch.py set_finish_with_abort), which 0.5.23 answers
as below (paths inside the 0.5.23 wheel).

What makes a request grammar-constrained is what turns into a json_schema, regex, ebnf or
structural_tag sampling parameter (entrypoints/openai/serving_chat.py): a response_format other than
text, a required or named tool choice, and SGLang's own regex/ebnf/json_schema fields.
"""

LOGPROBS = "DFLASH speculative decoding does not support return_logprob yet."
GRAMMAR = "DFLASH speculative decoding does not support grammar-constrained decoding yet."
# Request keys that ask for either (chat and /generate), for tests that check nothing else asks.
REFUSED_KEYS = ("logprobs", "top_logprobs", "return_logprob", "response_format", "tool_choice",
                "json_schema", "regex", "ebnf", "structural_tag")
CONSTRAINTS = ("json_schema", "regex", "ebnf", "structural_tag")  # SamplingParams' grammar fields


def chat_refusal(body: dict) -> str | None:
    """Why a DDTree server refuses this /v1/chat/completions body, or None."""
    if body.get("logprobs"):
        return LOGPROBS
    response_format = body.get("response_format") or {}
    tool_choice = body.get("tool_choice")
    if (isinstance(response_format, dict) and response_format.get("type") not in (None, "text")) \
            or (body.get("tools") and (tool_choice == "required" or isinstance(tool_choice, dict))) \
            or any(body.get(key) for key in CONSTRAINTS):
        return GRAMMAR
    return None


def generate_refusal(body: dict) -> str | None:
    """Why a DDTree server refuses this /generate body, or None."""
    if body.get("return_logprob"):
        return LOGPROBS
    params = body.get("sampling_params") or {}
    return GRAMMAR if any(params.get(key) for key in CONSTRAINTS) else None


def chat_error(message: str) -> dict:
    """A non-streamed chat request's 400 body (serving_base.py create_error_response, after
    tokenizer_manager.py _handle_abort_finish_reason raised ValueError)."""
    return {"object": "error", "message": message, "type": "BadRequest", "param": None, "code": 400}


def chat_stream_error(message: str) -> dict:
    """A streamed chat request's one event before `[DONE]`, after a 200 (serving_chat.py: an abort with a
    status code becomes create_streaming_error_response(message, code.name, code.value))."""
    return {"error": {"object": "error", "message": message, "type": "BAD_REQUEST", "param": None, "code": 400}}


def generate_error(message: str) -> dict:
    """A /generate request's 400 body (entrypoints/http_server.py _create_error_response)."""
    return {"error": {"message": message}}
