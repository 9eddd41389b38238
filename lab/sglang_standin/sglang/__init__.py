"""LAB STAND-IN for SGLang, not the real package (specfleet lab/sglang_standin).

Parses the real 0.5.23 CLI, resolves it with the real post-init rules a deploy
can meet (srt/resolution.py) and serves SGLang's HTTP endpoints with canned
answers, so the lab's hosts can be provisioned without GPUs. The wheel build
writes _build.json naming its variant; a source checkout is the plain build.
"""

import json
from importlib import resources

_DEFAULT_BUILD = {"version": "0.5.23+lab", "flags": "flags_0_5_23.json"}


def build_info() -> dict:
    """The variant this copy was built as: its version and its flag list."""
    path = resources.files(__name__) / "_build.json"
    return json.loads(path.read_text()) if path.is_file() else _DEFAULT_BUILD


__version__ = build_info()["version"]
