"""operations.venv: a release with a committed lock installs with --require-hashes (facts in, commands out)."""

import hashlib

from operations import venv
from operations.venv import VenvRequirement
from tests.unit.test_gpu_operations import FakeHost, run

VENV = "/opt/specfleet/tools-venv"


class WarnedHost(FakeHost):
    warnings: list[str] = []

    def log_styled(self, message, **styles):
        self.warnings.append(message)


def install(requirement: str, installed=None) -> list[str]:
    commands, _ = run(venv.requirement, {VenvRequirement: installed or {"version": None, "fingerprint": None}},
                      path=VENV, requirement=requirement, distribution="x", index_url="http://index/simple/")
    return commands


def test_a_release_with_a_committed_lock_installs_only_hashed_files():
    commands = install("huggingface_hub==2.4.0")
    lock = venv.committed_lock("huggingface_hub==2.4.0")
    assert "huggingface-hub==2.4.0 --hash=sha256:" in lock and "httpx2==2.16.2 --hash=sha256:" in lock
    assert commands[1].startswith(f"printf %s '# huggingface_hub==2.4.0") and commands[1].endswith(
        f"> {VENV}/.specfleet-requirements.lock")
    assert commands[2] == (f"{VENV}/bin/pip install --quiet --disable-pip-version-check --no-cache-dir "
                           f"--index-url http://index/simple/ --require-hashes -r {VENV}/.specfleet-requirements.lock")
    assert len(commands) == 4  # rebuild, lock, the one hash-checked install, marker


def test_a_requirement_carrying_its_hash_is_its_own_lock():
    pinned = "sglang==0.5.23+lab --hash=sha256:" + "a" * 64
    commands = install(pinned)
    assert commands[1] == f"printf %s '{pinned}\n' > {VENV}/.specfleet-requirements.lock"
    assert commands[2].endswith(f"--require-hashes -r {VENV}/.specfleet-requirements.lock")


def test_a_release_without_a_lock_installs_unchecked_and_says_so(monkeypatch):
    monkeypatch.setattr("tests.unit.test_gpu_operations.FakeHost", WarnedHost)
    commands = install("sglang==0.5.23")
    assert commands[1].endswith("--index-url http://index/simple/ sglang==0.5.23")
    assert any("sglang==0.5.23: no hash lock" in w for w in WarnedHost.warnings)


def test_fingerprint_covers_the_lock_and_keeps_unlocked_ones():
    plain = hashlib.sha256(b"sglang==0.5.23|None").hexdigest()[:16]
    assert venv.fingerprint("sglang==0.5.23", None) == plain  # no lock: as before, no rebuild
    hub = venv.fingerprint("huggingface_hub==2.4.0", None)
    assert hub != hashlib.sha256(b"huggingface_hub==2.4.0|None").hexdigest()[:16]
    installed = {"version": "2.4.0", "fingerprint": venv.fingerprint("huggingface_hub==2.4.0", "http://index/simple/")}
    assert install("huggingface_hub==2.4.0", installed) == []  # built from this lock: nothing to do
