"""Running the deployed-host checks on a broken lab host and reading what they caught
(tests/deployed/test_catches_faults.py, tests/lab/test_gateway.py)."""

import os
import re
import subprocess
import sys

from lab.config import TOKEN_GRANTED
from tests.helpers import REPO


def run_suite(*limit: str) -> subprocess.CompletedProcess:
    """`pytest tests/deployed --inventory lab/inventory.py --limit HOST` as a user runs it."""
    command = [sys.executable, "-m", "pytest", "tests/deployed", "--inventory", "lab/inventory.py",
               *(arg for name in limit for arg in ("--limit", name)),
               "-q", "--tb=short", "-p", "no:cacheprovider", "--color=no"]
    env = {**os.environ, "HF_TOKEN": TOKEN_GRANTED}
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, env=env, timeout=300)
    result.output = result.stdout + result.stderr
    result.failed = set(re.findall(r"^FAILED tests/deployed/\S+?::(\S+?)\[", result.output, flags=re.M))
    return result


def assert_caught(result, host: str, tests: set[str], *messages: str) -> None:
    """The suite failed exactly `tests` on `host`, saying `messages` (regexes)."""
    assert result.returncode == 1, f"expected the suite to fail, it exited {result.returncode}:\n{result.output[-3000:]}"
    assert result.failed == tests, f"expected {sorted(tests)} to fail, found {sorted(result.failed)}:\n{result.output[-3000:]}"
    messages_said = "\n".join(said(result.output))
    for message in messages:
        assert re.search(message, messages_said), f"expected the failure to say {message!r}:\n{result.output[-3000:]}"
    assert re.search(rf"^FAILED \S+\[{re.escape(host)}[\]-]", result.output, flags=re.M), result.output[-3000:]
    print(messages_said)  # shown with `pytest -rP`


def said(output: str) -> list[str]:
    """The assertion messages in pytest's output (multi-line ones whole), without its introspection."""
    messages, current = [], None
    for line in output.splitlines():
        if line.startswith("E   AssertionError: "):
            current = [line[len("E   AssertionError: "):]]
            messages.append(current)
        elif current is not None and line.startswith("E     "):  # a continuation line, before "E   assert"
            current.append(line[6:])
        else:
            current = None
    return sorted({"\n".join(message) for message in messages})
