"""Preflight on a host where every fact it reads is absent: sentences, never a traceback.

A fresh host has no virtualenv, no unit, no weights, no key and maybe no driver; a host program
that fails prints nothing. pyinfra then answers each fact with its default (None for most), and
that is what every check here gets.
"""

import pytest
from pyinfra.api import FunctionCommand

from deployment.hosts import resolve
from operations.gpu import checks
from operations.run import preflight
from operations.weights.checks import HubState
from operations.weights.hub import RepoFile, RepoSnapshot
from tests.unit.fakehost import FakeHost, run
from tests.unit.group_data import host_data

COMMIT = "0123456789abcdef0123456789abcdef01234567"


class AbsentFacts(dict):
    """Every fact's default, as pyinfra answers a fact whose command printed nothing."""

    def __missing__(self, fact_class):
        return fact_class.default()


def snapshots(d):
    files = (RepoFile("config.json", 100, None, "0" * 40), RepoFile("model.safetensors", 1 << 30, "a" * 64, None))
    return {repo.role: RepoSnapshot(repo.repo_id, COMMIT, files, {"model_type": "kimi_k2"}) for repo in d.weights.repos}


def outcome(operation, **kwargs) -> tuple[list[str], list[str]]:
    """(problems, noops) of one run of `operation` on a host answering every fact absent."""
    commands, noops = run(operation, AbsentFacts(), **kwargs)
    problems = [line for c in commands if isinstance(c, FunctionCommand) for line in c.args[0]]
    return problems, noops


@pytest.mark.parametrize("host_class", ["rtx_pro_6000_pcie", "b200_nvlink"])
@pytest.mark.parametrize("profile", ["kimi_k26_dflash", "qwen36_ddtree"])
@pytest.mark.parametrize("install_driver", [False, True])
@pytest.mark.parametrize("pending", [[], ["the token has no access to the gated repo z-lab/x: accept its terms"]])
def test_preflight_with_every_fact_absent_answers_in_sentences(host_class, profile, install_driver, pending,
                                                               monkeypatch):
    monkeypatch.delenv("SPECFLEET_API_KEY", raising=False)
    d = resolve(host_data(host_class, lab=True, profile=profile, install_driver=install_driver), host_class)
    readable = {role: snapshot for role, snapshot in snapshots(d).items() if not pending or role == "target"}
    problems, noops = outcome(preflight.check, worker=d.host, deployments=(d,), hubs=[HubState(readable, [], pending)])
    assert problems, noops  # nothing is known of the host: it cannot pass
    for problem in problems:
        assert problem.startswith(f"{FakeHost.name}: ") and "\n" not in problem, problem


@pytest.mark.parametrize("check", [checks.checked, checks.fabric_checked])
def test_the_gpu_checks_after_the_driver_answer_in_sentences_with_every_fact_absent(check):
    d = resolve(host_data("b200_nvlink", lab=True), "b200_nvlink")
    problems, _ = outcome(check, gpu=d.host.gpu)
    assert problems and all(p.startswith(f"{FakeHost.name}: ") for p in problems), problems


def test_a_ddtree_profile_on_a_release_pin_is_refused_in_preflight_naming_the_pull_request(monkeypatch):
    """No fact needed: the pin alone says that no release has DDTree (the lab's deploy of the same stops in
    Preflight, as every preflight refusal does: tests/lab/test_refusals.py)."""
    monkeypatch.delenv("SPECFLEET_API_KEY", raising=False)
    data = host_data("rtx_pro_6000_pcie", lab=True, profile="qwen36_ddtree")
    data.mirrors = {**data.mirrors, "requirements": {r: "sglang==0.5.23" for r in data.mirrors["requirements"]}}
    d = resolve(data, "rtx_pro_6000_pcie")
    problems, _ = outcome(preflight.check, worker=d.host, deployments=(d,), hubs=[HubState(snapshots(d), [], [])])
    assert [p for p in problems if "DDTree" in p] == [
        f"{FakeHost.name}: profile qwen36_ddtree uses DDTree, but sglang==0.5.23 is a release and no SGLang release "
        "up to 0.5.23 has DDTree (it is in open pull request #29907): set "
        "profiles['qwen36_ddtree']['sglang']['requirement'] to a build that has it, e.g. "
        "'sglang @ git+https://github.com/sgl-project/sglang@COMMIT#subdirectory=python' with the pull request's "
        "commit, or a wheel path/URL"]
