"""Runs ON THE HOST (system python3, stdlib only): one readiness probe of the local SGLang server.

Prints one JSON line: whether /health_generate answered 200, a chat completion's
text, and the speculative decoding state from /server_info. Reads the API key
from its 0600 file, so the key is never in a command line.
"""

import json
import sys
import urllib.error
import urllib.request
from pathlib import Path


def call(url: str, headers: dict, body: dict | None = None, timeout: float = 30):
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, headers={**headers, "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return response.status, json.loads(response.read() or b"null")


def main(port: str, model: str, key_file: str) -> None:
    base = f"http://127.0.0.1:{port}"
    key = Path(key_file)
    headers = {"Authorization": f"Bearer {key.read_text().strip()}"} if key.is_file() else {}
    result = {"ready": False}
    try:
        status, _ = call(f"{base}/health_generate", headers, timeout=30)
        result["ready"] = status == 200
        _, chat = call(f"{base}/v1/chat/completions", headers, {
            "model": model, "max_tokens": 32,
            "messages": [{"role": "user", "content": "In one sentence, what is speculative decoding?"}],
        }, timeout=120)
        result["completion"] = chat["choices"][0]["message"]["content"]
        _, info = call(f"{base}/server_info", headers)
        result["algorithm"] = info.get("speculative_algorithm")
        result["num_draft_tokens"] = info.get("speculative_num_draft_tokens")
        states = info.get("internal_states") or [{}]
        result["accept_length"] = states[0].get("avg_spec_accept_length")
    except (urllib.error.URLError, OSError, ValueError, KeyError) as error:
        result["error"] = str(error)[:200]
    print(json.dumps(result))


if __name__ == "__main__":
    main(*sys.argv[1:4])
