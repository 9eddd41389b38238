"""What an SGLang server's answers mean, and what of them may be kept (stdlib only: the host's probe
imports it by name, the controller as operations.server.host_scripts.engine_answers).

Generating. A thinking model (Kimi K2.6 with --reasoning-parser kimi_k2 thinks unless the request
says {"thinking": false}) puts its text in `reasoning_content` until it closes its reasoning, and
`content` is "" until then (SGLang 0.5.23 entrypoints/openai/serving_chat.py, parser/reasoning_parser.py):
a short answer of a healthy server can have no content at all. What the protocol guarantees of an
answer that generated is the tokens in `usage.completion_tokens` and text in either field.

Keeping. /server_info is every resolved server argument, `api_key` and `admin_api_key` included, and
`launch_command`, the argv with the `--api-key=KEY` the unit's launcher appends (utils/common.py
build_server_info). `scrubbed` is the one way an engine's answer is stored or printed: the secret
fields blanked, and their values masked wherever else they appear (the launch command, any text).
"""

import re

# The plain answer, where one is wanted: the request turns thinking off (the kimi_k2 detector's toggle).
NO_THINKING = {"chat_template_kwargs": {"thinking": False}}
# ServerArgs fields that hold a secret (the API keys, the TLS key's password, the watermark's keys).
SECRET_FIELDS = ("api_key", "admin_api_key", "ssl_keyfile_password", "watermark_key", "watermark_key_b",
                 "watermark_config")
MASK = "***"
# The secret flags in a command line, as `--flag=VALUE` or `--flag VALUE`.
_SECRET_FLAG = re.compile(r"(--(?:%s))([= ])(\S+)" % "|".join(f.replace("_", "-") for f in SECRET_FIELDS))


def answer_text(chat: dict) -> str:
    """A chat completion's text: its content, else its reasoning ("" when it has neither)."""
    try:
        message = chat["choices"][0]["message"]
    except (KeyError, IndexError, TypeError):
        return ""
    return (message.get("content") or message.get("reasoning_content") or "") if isinstance(message, dict) else ""


def generated_tokens(chat: dict) -> int:
    """usage.completion_tokens of a chat completion (0 when it reports none)."""
    usage = chat.get("usage") if isinstance(chat, dict) else None
    tokens = usage.get("completion_tokens") if isinstance(usage, dict) else None
    return tokens if isinstance(tokens, int) else 0


def generated(chat: dict) -> bool:
    """The chat completion is one the server generated: tokens counted, and text in content or reasoning."""
    return generated_tokens(chat) > 0 and bool(answer_text(chat).strip())


def scrubbed(answer):
    """`answer` (parsed JSON, or text) with every secret it carries masked."""
    secrets = set()

    def collect(value):
        if isinstance(value, dict):
            for key, item in value.items():
                if key in SECRET_FIELDS and isinstance(item, str) and item:
                    secrets.add(item)
                collect(item)
        elif isinstance(value, list):
            for item in value:
                collect(item)

    def mask(value):
        if isinstance(value, dict):
            return {key: (MASK if key in SECRET_FIELDS and item else mask(item)) for key, item in value.items()}
        if isinstance(value, list):
            return [mask(item) for item in value]
        if isinstance(value, str):
            value = _SECRET_FLAG.sub(lambda m: m.group(1) + m.group(2) + MASK, value)
            for secret in sorted(secrets, key=len, reverse=True):
                value = value.replace(secret, MASK)
        return value

    collect(answer)
    return mask(answer)
