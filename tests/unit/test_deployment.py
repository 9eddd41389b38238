"""Resolving a host's deployment and rendering SGLang's command line, checked by the real parser."""

import pytest

from lab.repos import build_lab_repos
from operations.deployment import HOST_CLASSES, host_class_of, resolve
from operations.hub import RepoSnapshot
from operations.preflight import unpinned
from operations.sglang import server_args, spell
from tests.sglang_real import parse_many_with_real_sglang
from tests.unit.group_data import host_data


def test_window_and_mamba_flags_are_spelled_for_the_pinned_version():
    assert spell("--speculative-draft-window-size", "0.5.11") == "--speculative-dflash-draft-window-size"
    assert spell("--speculative-draft-window-size", "0.5.13") == "--speculative-draft-window-size"
    assert spell("--mamba-radix-cache-strategy", "0.5.13") == "--mamba-scheduler-strategy"
    assert spell("--mamba-radix-cache-strategy", "0.5.23+lab") == "--mamba-radix-cache-strategy"
    data = host_data("rtx_pro_6000_pcie")
    data.profiles["kimi_k26_dflash"]["sglang"]["version"] = "0.5.11"
    assert "--speculative-dflash-draft-window-size" in server_args(resolve(data, "rtx_pro_6000_pcie"))


def test_each_class_gets_its_backends_and_environment():
    pcie = resolve(host_data("rtx_pro_6000_pcie"), "rtx_pro_6000_pcie")
    b200 = resolve(host_data("b200_nvlink"), "b200_nvlink")
    assert (pcie.attention_backend, pcie.draft_attention_backend) == ("flashinfer", "flashinfer")
    assert (b200.attention_backend, b200.draft_attention_backend) == ("trtllm_mla", "fa4")
    assert pcie.env["NCCL_P2P_LEVEL"] == "SYS" and "NCCL_P2P_LEVEL" not in b200.env
    assert pcie.target.local_dir == "/srv/specfleet/models/moonshotai--Kimi-K2.6"


def test_lab_mirrors_swap_repos_and_ddtree_build_but_keep_paths():
    lab = resolve(host_data("b200_nvlink", lab=True, profile="qwen36_ddtree"), "b200_nvlink")
    assert lab.target.repo_id == "lab/Qwen3.6-27B-tiny" and len(lab.target.revision) == 40
    assert lab.target.local_dir.endswith("Qwen--Qwen3.6-27B")
    assert lab.sglang_requirement.endswith("sglang-0.5.23+lab.ddtree29907-py3-none-any.whl")


def test_lab_pins_are_the_commits_the_lab_hub_builds(tmp_path):
    shas = build_lab_repos(tmp_path)
    data = host_data("b200_nvlink", lab=True)
    for pinned in data.mirrors["repos"].values():
        repo_id, commit = pinned.split("@")
        assert shas[repo_id] == commit, f"lab/group_data/lab.py pins {repo_id} at {commit}, lab/repos.py builds {shas[repo_id]}"


def test_a_host_needs_exactly_one_class_group():
    assert host_class_of(["all", "lab", "b200_nvlink"]) == "b200_nvlink"
    with pytest.raises(ValueError, match="exactly one"):
        host_class_of(["all", "ct200"])


def test_rendered_command_lines_parse_with_the_real_sglang_0_5_23():
    kimi = [server_args(resolve(host_data(c), c)) for c in HOST_CLASSES]
    ddtree = server_args(resolve(host_data("b200_nvlink", profile="qwen36_ddtree"), "b200_nvlink"))
    results = parse_many_with_real_sglang([*kimi, ddtree])
    for argv, result in zip(kimi, results):
        assert result["ok"], f"real SGLang 0.5.23 rejects {argv}: {result.get('stderr')}"
        parsed = result["args"]
        assert parsed["speculative_algorithm"] == "DFLASH" and parsed["speculative_num_draft_tokens"] == 8
        assert parsed["speculative_draft_window_size"] == 4096 and parsed["tp_size"] == 8
    # DDTree is not in 0.5.23: its budget flag is refused, which is why the profile needs PR #29907.
    assert not results[-1]["ok"] and "--speculative-ddtree-budget" in results[-1]["stderr"]


def test_branch_revisions_are_reported_unpinned_and_lab_commits_are_not():
    commit = "0123456789abcdef0123456789abcdef01234567"
    snapshots = {role: RepoSnapshot(f"r/{role}", commit, (), {}) for role in ("target", "drafter")}
    real = resolve(host_data("b200_nvlink"), "b200_nvlink")
    assert [w.split(":")[0] for w in unpinned(real, snapshots)] == ["moonshotai/Kimi-K2.6", "z-lab/Kimi-K2.6-DFlash"]
    assert f"resolves to {commit} now" in unpinned(real, snapshots)[0]
    assert unpinned(resolve(host_data("b200_nvlink", lab=True), "b200_nvlink"), snapshots) == []
