"""The pre-restart check (SGLangRejects), its command run here against the REAL SGLang 0.5.23 env."""

import subprocess

import pytest

from operations.server.flags import SGLangRejects
from tests.sglang_real import ENV_DIR, real_sglang_python
from tests.unit.resolution_cases import lab_repos


@pytest.fixture(scope="module")
def rejects():
    real_sglang_python()  # builds the env on first use
    fact = SGLangRejects()

    def check(argv: list[str], env: tuple = ()) -> str | None:
        command = fact.command(str(ENV_DIR), tuple(argv), env)
        proc = subprocess.run(["bash", "-c", command], capture_output=True, text=True)
        return fact.process(proc.stdout.splitlines())

    return check


def test_argparse_refusal_is_reported(rejects):
    assert rejects(["--model-path", "/m", "--speculative-ddtree-budget", "15"]) == (
        "sglang serve: error: unrecognized arguments: --speculative-ddtree-budget 15")


def test_without_weights_on_disk_only_the_parser_judges(rejects):
    assert rejects(["--model-path", "/nonexistent", "--page-size", "1"]) is None


def test_resolution_refusal_is_reported(rejects, tmp_path):
    """With the weights present the real resolution runs: on this GPU-less machine it refuses as
    it would on a host whose driver is gone."""
    repos = lab_repos(tmp_path)
    argv = ["--model-path", repos["Qwen/Qwen3.6-27B"], "--speculative-algorithm", "DFLASH",
            "--speculative-draft-model-path", repos["z-lab/Qwen3.6-27B-DFlash"]]
    assert rejects(argv) == "RuntimeError: No accelerator (CUDA, XPU, HPU, NPU, MUSA, MPS) or platform plugin is available."
