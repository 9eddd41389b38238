"""LAB STAND-IN for SGLang 0.5.23's detokenizer process (srt/managers/detokenizer_manager.py).

One process titled `sglang::detokenizer` that first sets PR_SET_PDEATHSIG=SIGKILL
(detokenizer_manager.py:550-551) and installs no SIGTERM handler. It turns the scheduler's token
ranges into text for the main process. The stand-in's "tokens" are words: `reply()` derives a
request's words from its prompt, so the same prompt always gets the same answer. A prompt that ends
inside a reasoning block (the chat server appended THINK_START) is answered as a thinking model
answers: THINKING_TOKENS tokens of reasoning, THINK_END, then the answer, so a short request's
answer is all reasoning.
"""

import hashlib
from multiprocessing.connection import Connection

from sglang.srt.parser.reasoning_parser import THINK_END, THINK_START
from sglang.srt.utils import hang, kill_itself_when_parent_died, set_process_title

WORDS = ("alpha", "bravo", "draft", "verify", "token", "block", "tree", "accept",
         "lab", "spec", "decode", "prefill", "cache", "kernel", "batch", "reply")
# More than the 32 tokens a readiness probe asks for: its answer is all reasoning, as a real thinking
# model's short answer is.
THINKING_TOKENS = 48


def reply(prompt: str, max_tokens: int) -> list[str]:
    """`max_tokens` deterministic words derived from the prompt (a hash chain, 32 words a link); after a
    prompt that opens a reasoning block, the first THINKING_TOKENS of them are reasoning, then THINK_END."""
    words, digest = [], hashlib.sha256(prompt.encode()).digest()
    while len(words) < max(1, max_tokens):
        words += [WORDS[b % len(WORDS)] for b in digest]
        digest = hashlib.sha256(digest).digest()
    if prompt.endswith(THINK_START):
        words.insert(THINKING_TOKENS, THINK_END)
    return words[: max(1, max_tokens)]


def run_detokenizer_process(from_scheduler: Connection, to_tokenizer: Connection) -> None:
    kill_itself_when_parent_died()
    set_process_title("sglang::detokenizer")
    words: dict[str, list[str]] = {}
    while True:
        try:
            message = from_scheduler.recv()
        except (EOFError, OSError):
            hang()  # a ZMQ socket whose peer is gone just waits
        kind = message[0]
        if kind == "new":
            _, rid, prompt, total = message
            words[rid] = reply(prompt, total)
        elif kind == "abort":
            words.pop(message[1], None)
        elif kind == "batch":
            out = []
            for rid, start, end, finished in message[1]:
                text = " ".join(words.get(rid, [])[start:end])
                out.append((rid, text, end, finished))
                if finished:
                    words.pop(rid, None)
            try:
                to_tokenizer.send(("out", out))
            except OSError:
                hang()
