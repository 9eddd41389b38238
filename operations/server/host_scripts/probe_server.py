"""Runs ON THE HOST (system python3, stdlib only): one readiness probe of the local SGLang server.

Prints one JSON line: whether the server is ready (/ready, else /health_generate: see `ready`),
whether a chat completion generated (engine_answers.generated: tokens counted, text in its content
or, from a thinking model, its reasoning) and its text, and the speculative decoding state from
/server_info. Reads the API key
from its file, so the key is never in a command line; and sends it only over a
connection whose server end the service user owns: while the server is down,
any local user may bind its port, and must not receive the key.
"""

import http.client
import json
import pwd
import socket
import sys
from pathlib import Path

from engine_answers import answer_text, generated
from owned_sockets import LOOPBACK, OwnedConnection

# The completion's length: a few tokens prove the engine generates as well as many, and each decode step
# is on the path of every no-op (the lab's engine at DFlash's accept length 3.45: 32 tokens took 0.29 s of
# a 0.45 s host program, 8 take 0.10 s) and of every readiness poll.
PROBE_TOKENS = 8


class Connection(OwnedConnection):
    """A loopback connection to the server that goes on only when the service user serves its port."""

    def __init__(self, port: int, uid: int, timeout: float):
        super().__init__(LOOPBACK, port, uid, timeout, whose="the service")


class Refused(OSError):
    """The server answered with an HTTP error status."""


def call(port: int, uid: int, path: str, headers: dict, body: dict | None = None, timeout: float = 30):
    connection = Connection(port, uid, timeout)
    try:
        connection.request("POST" if body is not None else "GET", path,
                           body=json.dumps(body).encode() if body is not None else None,
                           headers={**headers, "Content-Type": "application/json"})
        response = connection.getresponse()
        data = response.read()
    finally:
        connection.close()
    if response.status >= 400:
        raise Refused(f"HTTP Error {response.status}: {response.reason} ({path})")
    return response.status, json.loads(data or b"null")


def ready(port: int, uid: int, headers: dict) -> bool:
    """Whether the server takes requests. /ready answers at once from SGLang's own state (0.5.23
    http_server.py: up, neither paused nor shutting down); /health_generate holds every answer for at
    least a second (its first check of the generation follows an asyncio.sleep(1)), which every no-op
    would wait for. A server /ready refuses is asked /health_generate all the same: SGLang marks a
    server unhealthy after a failed health check, and only a health check that generates marks it up
    again (and a server before 0.5.20 has no /ready). The completion after it is the proof that the
    engine generates."""
    try:
        status, _ = call(port, uid, "/ready", headers, timeout=30)
    except Refused:
        status, _ = call(port, uid, "/health_generate", headers, timeout=30)
    return status == 200


def probe(port: str, model: str, key_file: str, service_user: str) -> dict:
    """One probe's result (what main prints)."""
    key = Path(key_file)
    headers = {"Authorization": f"Bearer {key.read_text().strip()}"} if key.is_file() else {}
    result = {"ready": False}
    try:
        uid = pwd.getpwnam(service_user).pw_uid
        result["ready"] = ready(int(port), uid, headers)
        _, chat = call(int(port), uid, "/v1/chat/completions", headers, {
            "model": model, "max_tokens": PROBE_TOKENS,
            "messages": [{"role": "user", "content": "In one sentence, what is speculative decoding?"}],
        }, timeout=120)
        result["generated"] = generated(chat)
        result["completion"] = answer_text(chat)
        _, info = call(int(port), uid, "/server_info", headers)
        result["algorithm"] = info.get("speculative_algorithm")
        result["num_draft_tokens"] = info.get("speculative_num_draft_tokens")
        states = info.get("internal_states") or [{}]
        result["accept_length"] = states[0].get("avg_spec_accept_length")
        result["max_total_num_tokens"] = info.get("max_total_num_tokens")  # the KV pool the engine sized
    except (OSError, socket.timeout, http.client.HTTPException, ValueError, KeyError) as error:
        result["error"] = str(error)[:200] or type(error).__name__
    return result


def main(port: str, model: str, key_file: str, service_user: str) -> None:
    print(json.dumps(probe(port, model, key_file, service_user)))


def answer(args: dict) -> list[str]:
    """ServerProbe's lines, for host_state.py: what this program prints. Several probes (one a replica)
    run at once in threads of one process, so each returns its line instead of printing it."""
    try:
        return [json.dumps(probe(str(args["port"]), args["model"], args["key_file"], args["service_user"]))]
    except Exception as error:  # as the program's own traceback would end its output
        return [f"{type(error).__name__}: {error}"]


if __name__ == "__main__":
    main(*sys.argv[1:5])
