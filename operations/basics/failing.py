"""Failing one host with a readable reason, without stopping the others."""

from pyinfra.api import FunctionCommand


def _report(state, host, problems: list[str]) -> bool:
    for problem in problems:
        host.log_styled(problem, fg="red")
    return False  # a failed command: pyinfra drops this host from the rest of the deploy


def fail_host(problems: list[str]) -> FunctionCommand:
    """A command that logs each problem and fails the host it runs on (the others go on)."""
    return FunctionCommand(_report, (problems,), {})
