"""operations.basics.polling.wait: the outcome, the timeout, and progress logged at most every log_every_s
(on a simulated clock: sleeping advances it, nothing else does)."""

import pytest

from operations.basics import polling


class Clock:
    def __init__(self):
        self.now = 1000.0

    def monotonic(self):
        return self.now

    def sleep(self, seconds):
        self.now += seconds


class LoggingHost:
    def __init__(self):
        self.lines = []

    def log(self, line):
        self.lines.append(line)


@pytest.fixture
def clock(monkeypatch):
    clock = Clock()
    monkeypatch.setattr(polling, "time", clock)
    return clock


def test_returns_the_first_outcome_and_logs_progress_at_most_every_log_every_s(clock):
    host, seen = LoggingHost(), []

    def check(elapsed):
        seen.append(elapsed)
        return ("done" if elapsed >= 95 else None), f"at {elapsed:.0f}s"

    assert polling.wait(host, check, interval_s=5, log_every_s=30) == "done"
    assert seen == [5.0 * i for i in range(20)]
    assert host.lines == ["at 0s", "at 30s", "at 60s", "at 90s"]


def test_a_timeout_returns_none_and_a_false_outcome_is_an_outcome(clock):
    host = LoggingHost()
    assert polling.wait(host, lambda elapsed: (None, ""), interval_s=2, log_every_s=1, timeout_s=60) is None
    assert clock.now == 1060.0 and host.lines == []  # no progress text, nothing logged
    assert polling.wait(host, lambda elapsed: (False, "x"), interval_s=2, log_every_s=1) is False


def test_the_first_progress_waits_for_first_log_s(clock):
    host = LoggingHost()
    polling.wait(host, lambda elapsed: (True if elapsed >= 40 else None, f"loading {elapsed:.0f}s"),
              interval_s=2, log_every_s=30, first_log_s=10)
    assert host.lines == ["loading 10s"]
