"""One poll-and-log loop for the deploy's waits on a host (downloads, readiness).

Each wait is a `check` run every `interval_s`: it looks at the host once and says whether
the wait is over (an outcome) and what to tell the user meanwhile (a progress line, logged
at most every `log_every_s` so a long wait is shown, not flooded).
"""

import time
from collections.abc import Callable
from typing import Any


def wait(host, check: Callable[[float], tuple[Any, str]], interval_s: float, log_every_s: float,
         timeout_s: float | None = None, first_log_s: float = 0.0) -> Any:
    """
    Call `check(elapsed_s)` until it returns an outcome other than None; return that outcome,
    or None once `timeout_s` has passed.

    `check` returns (outcome, progress): progress is logged on `host` (first after
    `first_log_s`, then at most every `log_every_s`).

    **Example:**

    .. code:: python

        done = poll.wait(host, lambda elapsed: (True, "") if finished() else (None, "still going"),
                         interval_s=0.5, log_every_s=10, timeout_s=600)
    """
    started = time.monotonic()
    next_log = started + first_log_s
    while True:
        elapsed = time.monotonic() - started
        outcome, progress = check(elapsed)
        if outcome is not None:
            return outcome
        if timeout_s is not None and elapsed >= timeout_s:
            return None
        if progress and time.monotonic() >= next_log:
            host.log(progress)
            next_log = time.monotonic() + log_every_s
        time.sleep(interval_s)
