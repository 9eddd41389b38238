"""operations/server/host_scripts/engine_answers.py: what counts as generated, and the one scrubber."""

import json

from operations.server.host_scripts.engine_answers import answer_text, generated, scrubbed

KEY, ADMIN = "sk-lab-0123456789abcdef", "admin-9876543210fedcba"


def chat(content, reasoning=None, tokens=32) -> dict:
    return {"choices": [{"index": 0, "message": {"role": "assistant", "content": content,
                                                  "reasoning_content": reasoning}, "finish_reason": "length"}],
            "usage": {"prompt_tokens": 9, "completion_tokens": tokens, "total_tokens": 9 + tokens}}


def test_a_thinking_answer_with_no_content_yet_generated():
    # Kimi K2.6 thinking: a 32-token answer is all reasoning (SGLang 0.5.23's kimi_k2 parser).
    thinking = chat("", "The user asks what speculative decoding is. A draft model proposes")
    assert generated(thinking) and answer_text(thinking).startswith("The user asks")
    assert generated(chat("Drafts are verified in one pass.")) and answer_text(chat("A", "B")) == "A"


def test_no_tokens_or_no_text_is_not_generated():
    assert not generated(chat("", None))
    assert not generated(chat("text", tokens=0))
    assert not generated({"choices": [{"message": {"content": "text"}}]})  # no usage: nothing counted
    assert not generated({"error": "x"}) and answer_text({"choices": []}) == ""


def test_the_scrubber_masks_every_secret_field_and_its_value_wherever_it_appears():
    info = {"api_key": KEY, "admin_api_key": ADMIN, "ssl_keyfile_password": None, "port": 30000,
            "launch_command": f"--model-path /srv/m --port 30000 --api-key={KEY}",
            "internal_states": [{"note": f"served with {ADMIN}"}], "watermark_key": ""}
    clean = scrubbed(info)
    text = json.dumps(clean)
    assert KEY not in text and ADMIN not in text
    assert clean["api_key"] == clean["admin_api_key"] == "***" and clean["ssl_keyfile_password"] is None
    assert clean["launch_command"] == "--model-path /srv/m --port 30000 --api-key=***"
    assert clean["port"] == 30000 and clean["watermark_key"] == ""
    assert info["api_key"] == KEY  # the answer itself is left as it came


def test_the_scrubber_masks_secret_flags_in_text_whose_value_it_was_not_told():
    assert scrubbed("sglang serve --admin-api-key s3cret --api-key=other --port 1") == \
        "sglang serve --admin-api-key *** --api-key=*** --port 1"
