"""tests/deployed with the hub unreachable: the hub is asked once, the checks that need it are skipped with one
reason, the others run (tests/deployed/hosts.py hub_snapshot)."""

import pytest

from tests.deployed import hosts


def test_an_unreachable_hub_is_asked_once_and_skips_what_needs_it(monkeypatch):
    asked = []

    def down(endpoint, token, repo_id, revision):
        asked.append(repo_id)
        raise OSError("[Errno 111] Connection refused")

    monkeypatch.setattr(hosts, "snapshot", down)
    monkeypatch.setattr(hosts, "_UNREACHED", {})
    reasons = set()
    for repo_id in ("lab/Kimi-K2.6-tiny", "lab/Kimi-K2.6-DFlash-tiny", "lab/Kimi-K2.6-tiny"):
        with pytest.raises(pytest.skip.Exception) as skipped:
            hosts.hub_snapshot("http://127.0.0.1:9/", None, repo_id, "main")
        reasons.add(str(skipped.value))
    assert asked == ["lab/Kimi-K2.6-tiny"]  # one wait for a hub that does not answer, not one a check
    assert len(reasons) == 1 and reasons.pop().startswith(
        "the hub at http://127.0.0.1:9 did not answer as a hub does (OSError: [Errno 111] Connection refused)")


def test_a_hub_that_answers_is_not_skipped(monkeypatch):
    monkeypatch.setattr(hosts, "snapshot", lambda *args: "snapshot")
    monkeypatch.setattr(hosts, "_UNREACHED", {})
    assert hosts.hub_snapshot(None, None, "a/b", "main") == "snapshot"
