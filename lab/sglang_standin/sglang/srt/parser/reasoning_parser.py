"""LAB STAND-IN for SGLang 0.5.23's reasoning parsers (srt/parser/reasoning_parser.py) and the chat
server's choice of thinking (srt/entrypoints/openai/serving_chat.py, _get_reasoning_from_request).

A chat request to a server started with --reasoning-parser is a thinking request unless its
chat_template_kwargs turn the detector's toggle off (reasoning_default "thinking" for kimi_k2:
thinking unless {"thinking": false}). For a detector that does not think internally, the chat
server appends THINK_START to the prompt (serving_chat.py, "hard code thinking token"), so the
model's text starts inside its reasoning, and the parser runs with force_reasoning: the text
before THINK_END is reasoning_content, the rest content; a text that never reaches THINK_END is
all reasoning (BaseReasoningFormatDetector._detect_and_parse_impl). Parsers absent from
REASONING_TOGGLES are not modelled: the stand-in answers them without thinking.
"""

THINK_START, THINK_END = "<think>", "</think>"
# --reasoning-parser -> the chat_template_kwargs key whose False turns thinking off (the detector's
# reasoning_default, with no reasoning config in the chat template).
REASONING_TOGGLES = {"kimi_k2": "thinking"}


def thinks(reasoning_parser: str | None, chat_template_kwargs: dict | None) -> bool:
    """Whether a chat request is a thinking one (_get_reasoning_from_request's parser-level default)."""
    toggle = REASONING_TOGGLES.get(reasoning_parser or "")
    if toggle is None:
        return False
    return not chat_template_kwargs or chat_template_kwargs.get(toggle) is not False


def split(text: str) -> tuple[str, str]:
    """(reasoning, content) of a text generated inside the reasoning (force_reasoning=True)."""
    reasoning, _, content = text.partition(THINK_END)
    return reasoning, content


class StreamSplitter:
    """The split of a streamed answer, one decode step's text at a time: (reasoning delta, content delta)."""

    def __init__(self):
        self.text, self.reasoning, self.content = "", "", ""

    def feed(self, delta: str) -> tuple[str, str]:
        self.text += delta
        reasoning, content = split(self.text)
        out = reasoning[len(self.reasoning):], content[len(self.content):]
        self.reasoning, self.content = reasoning, content
        return out
