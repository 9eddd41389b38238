"""Failing one host with a readable reason, without stopping the others; the same reason under --dry.

pyinfra runs an operation's commands only in the real run, so a refusal made of a command alone would
say nothing under --dry. When pyinfra evaluates an operation's body before running anything (--dry,
or a run without -y detecting changes), `fail_host` logs the problems right then, in the words the
real run prints, wherever the real run is certain to make them: when no operation before it on the
host would change anything (its facts are the ones the run will read: preflight, or any refusal of a
re-run), or when the refusal depends on nothing the run changes (`static`: the inventory's data, the
controller's variables, the hub). A refusal read from a state earlier operations would change (the
GPUs once a driver is installed) can only be known by running them. `refused` lets the deploy file
prepare nothing more for a host so refused, as the real run stops it there.
"""

import sys
import weakref

from pyinfra.api import FunctionCommand
from pyinfra.context import ctx_host

from operations.basics import outcomes

_refused: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # host -> problems met before the run


def _report(state, host, problems: list[str]) -> bool:
    outcomes.note(host, refused=problems[0] if problems else "refused")
    for problem in problems:
        host.log_styled(problem, fg="red")
    return False  # a failed command: pyinfra drops this host from the rest of the deploy


def _certain(state, host, static: bool) -> bool:
    """Evaluated before the run, is this refusal the one the run will make?"""
    return static or state.get_meta_for_host(host).ops_change == 0  # no earlier operation changes anything


def fail_host(problems: list[str], static: bool = False) -> FunctionCommand:
    """A command that logs each problem and fails the host it runs on (the others go on); evaluated before
    the run (--dry), the problems are logged at once where the run is certain to make them (`static`: they
    depend on nothing the run changes)."""
    current = ctx_host.get() if ctx_host.isset() else None
    state = getattr(current, "state", None)
    if state is not None and not state.is_executing and _certain(state, current, static):
        _before_the_run(current, problems)
    return FunctionCommand(_report, (problems,), {})


def failed(problems: list[str], static: bool = False):
    """What an operation yields to fail its host (`fail_host`): nothing where the refusal was said before the
    run (the host is counted failed, and --dry then lists the operation as no change, as it changes nothing);
    the failing command in the run.

    **Example:**

    .. code:: python

        if problems:
            yield from failing.failed(problems)
            return
    """
    command = fail_host(problems, static)
    current = ctx_host.get() if ctx_host.isset() else None
    state = getattr(current, "state", None)
    if state is not None and not state.is_executing and _refused.get(current):
        return
    yield command


def _before_the_run(current, problems: list[str]) -> None:
    """Said before the run, the refusal counts the host among pyinfra's failed hosts, so that --dry exits 1
    (pyinfra_cli's _exit); the host stays active until its refusing command fails it in the run."""
    _report(current.state, current, problems)
    _refused[current] = problems
    current.state.failed_hosts.add(current)


def refuse_at_load(problems: list[str]) -> None:
    """Say a refusal known from the host's data alone as the deploy file is read, and count the host failed.

    Under -y pyinfra evaluates no operation before the run, and --dry runs none, so a refusal left to an
    operation would say nothing under `--dry -y` and exit 0. Said here, it is printed whatever the flags;
    the host is counted among pyinfra's failed hosts, which make it exit 1 (pyinfra_cli's _exit); the
    caller prepares nothing more for it (`refused`).
    """
    _before_the_run(ctx_host.get(), problems)


def dry_is_a_gate(state) -> None:
    """Under `--dry -y`, evaluate the operations before the run as `--dry` alone does, so that every refusal
    made inside one (preflight's: the host's state, the hub's answer for the token and each repo) is said and
    fails its host, and the run exits 1 (pyinfra_cli's _exit).

    pyinfra's -y skips that evaluation (``State(check_for_changes=not yes)``) and --dry runs nothing, so such a
    refusal would be said nowhere and `--dry -y` exit 0. A dry run changes nothing however it is evaluated.
    The CLI keeps --dry to itself: its own command line tells it (a deploy file is read inside it).

    **Example:**

    .. code:: python

        failing.dry_is_a_gate(host.state)  # a deploy file's first line
    """
    if "--dry" in sys.argv[1:] and not state.check_for_changes:
        state.check_for_changes = True


def refused(host) -> bool:
    """The host met a refusal while pyinfra evaluated its operations before the run (--dry, or change
    detection without -y): the real run stops it there, so nothing after it is worth preparing."""
    return bool(_refused.get(ctx_host.get() if ctx_host.isset() else host))
