"""Failing one host with a readable reason, without stopping the others; the same reason under --dry.

pyinfra runs an operation's commands only in the real run, so a refusal made of a command alone would
say nothing under --dry. When pyinfra evaluates an operation's body before running anything (--dry,
or a run without -y detecting changes), `fail_host` logs the problems right then, in the words the
real run prints, and `refused` lets the deploy file prepare nothing more for that host, as the real run
stops it there.
"""

import weakref

from pyinfra.api import FunctionCommand
from pyinfra.context import ctx_host

_refused: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # host -> problems met before the run


def _report(state, host, problems: list[str]) -> bool:
    for problem in problems:
        host.log_styled(problem, fg="red")
    return False  # a failed command: pyinfra drops this host from the rest of the deploy


def fail_host(problems: list[str]) -> FunctionCommand:
    """A command that logs each problem and fails the host it runs on (the others go on); evaluated before
    the run (--dry), the problems are logged at once."""
    current = ctx_host.get() if ctx_host.isset() else None
    state = getattr(current, "state", None)
    if state is not None and not state.is_executing:
        _report(state, current, problems)
        _refused[current] = problems
    return FunctionCommand(_report, (problems,), {})


def refused(host) -> bool:
    """The host met a refusal while pyinfra evaluated its operations before the run (--dry, or change
    detection without -y): the real run stops it there, so nothing after it is worth preparing."""
    return bool(_refused.get(ctx_host.get() if ctx_host.isset() else host))
