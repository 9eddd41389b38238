"""What the REAL SGLang 0.5.23 makes of every rendered command line, on each class's GPU.

The real release resolves each class x profile through its full ServerArgs construction and
post-init hooks (tests/sglang_real_gpu.py says which GPU queries are answered with the class's
GPU, and why), with the lab's tiny repos (configs shaped like the real ones) as model folders.
The lab's stand-in engine must agree with it, good combinations and bad ones alike.
"""

import json
from dataclasses import replace
import os
import runpy
import subprocess
import sys
from pathlib import Path

import pytest

from deployment import site_data
from deployment.hosts import resolve
from deployment.server.command_line import rendered_violations as rendered_ddtree_violations
from deployment.server.speculative import ALGORITHMS, DDTREE, EAGLE_PAGED_TREE_BACKENDS, Speculative
from operations.server.flags import RESOLVE
from tests.gpu_standin_env import gpu_standin_env
from tests.sglang_real import resolve_many_with_real_sglang
from tests.unit.group_data import host_data
from tests.unit.resolution_cases import DRAFTERLESS, GPU_PROFILES, PROFILES, case, deployment, lab_repos

HOST_CLASSES = site_data.host_classes()  # the product's, as the suite runs without a site

REPO = Path(__file__).resolve().parents[2]
STANDIN_SRC = REPO / "lab" / "sglang_standin"
ddtree_violations, ddtree_builds_tree, ddtree_target_backend = DDTREE.violations, DDTREE.builds_tree, \
    DDTREE.target_backend
COMBOS = [(c, p) for c in HOST_CLASSES for p in PROFILES]
OWN_COMBOS = [(c, p) for c in HOST_CLASSES for p in DRAFTERLESS]
# What the deploy relies on in the resolved settings (and what the stand-in must get right).
KEYS = ("page_size", "attention_backend", "speculative_algorithm", "speculative_num_draft_tokens",
        "speculative_num_steps", "speculative_eagle_topk", "speculative_draft_attention_backend",
        "max_running_requests", "cuda_graph_max_bs_decode")
H100 = {"name": "NVIDIA H100 80GB HBM3", "compute_capability": "9.0", "count": 8, "memory_mib": 81559}


def bad_cases(repos) -> dict[str, dict]:
    """Combinations argparse accepts and the real resolution refuses."""
    kimi_b200 = case(deployment("b200_nvlink", "kimi_k26_dflash", repos))
    argv = kimi_b200["argv"]
    draft = argv.index("--speculative-draft-model-path")
    return {
        "trtllm_mla on a Hopper GPU": {**kimi_b200, "gpu": H100},
        "no drafter": {**kimi_b200, "argv": argv[:draft] + argv[draft + 2:]},
        "block size differs": {**kimi_b200, "argv": argv + ["--speculative-dflash-block-size", "16"]},
        "draft window below the block": {**kimi_b200, "argv": argv + ["--speculative-draft-window-size", "4"]},
        "pipeline parallel": {**kimi_b200, "argv": argv + ["--pp-size", "2"]},
    }


@pytest.fixture(scope="module")
def repos(tmp_path_factory) -> dict[str, str]:
    return lab_repos(tmp_path_factory.mktemp("repos"))


@pytest.fixture(scope="module")
def cases(repos) -> dict:
    good = {combo: case(deployment(*combo, repos)) for combo in COMBOS + OWN_COMBOS}
    rules = {name: case(server(repos)) for name, (server, _) in RULE_CASES.items()}
    # The DDTree profile's old B200 setting: trtllm_mha (its --page-size 1 is overridden).
    old_ddtree = {OLD_DDTREE: case(old_ddtree_deployment(repos))}
    return {**good, **old_ddtree, **bad_cases(repos), **rules}


OLD_DDTREE = "qwen36_ddtree on b200 with trtllm_mha"


def old_ddtree_deployment(repos):
    """trtllm_mha, with a mamba strategy it takes: no_buffer refuses trtllm_mha in resolution (0.5.23
    arg_groups/mamba_hook.py validate_mamba_no_buffer), a refusal beside the page size this case is about."""
    d = deployment("b200_nvlink", "qwen36_ddtree", repos, attention_backend="trtllm_mha")
    args = list(d.engine.extra_args)
    args[args.index("--mamba-radix-cache-strategy") + 1] = "extra_buffer"
    return replace(d, engine=replace(d.engine, extra_args=tuple(args)))


@pytest.fixture(scope="module")
def real(cases) -> dict:
    """The real release's answer per case (one warmed process, a fork per case)."""
    return dict(zip(cases, resolve_many_with_real_sglang(list(cases.values()))))


@pytest.mark.parametrize("combo", COMBOS, ids=[f"{c}-{p}" for c, p in COMBOS])
def test_real_sglang_resolves_each_class_and_profile_as_the_deploy_expects(combo, real, repos):
    host_class, profile = combo
    d = deployment(host_class, profile, repos)
    result = real[combo]
    assert "error" not in result, f"real SGLang 0.5.23 refuses {host_class} x {profile}: {result['error']}"
    r = result["resolved"]
    assert r["attention_backend"] == d.engine.attention_backend
    assert r["speculative_draft_attention_backend"] == d.engine.draft_attention_backend
    assert r["speculative_algorithm"] == "DFLASH"  # DDTree drafts with DFlash (PR #29907)
    assert r["speculative_num_draft_tokens"] == d.engine.speculative.num_draft_tokens
    assert (r["speculative_num_steps"], r["speculative_eagle_topk"]) == (1, 1)
    assert r["tp_size"] == d.engine.tp_size
    # Every batch size the scheduler may run gets a CUDA graph (None: SGLang sizes it to fit).
    graphs = r["cuda_graph_max_bs_decode"]
    assert graphs is None or graphs >= r["max_running_requests"], (
        f"CUDA graphs up to batch {graphs}, but up to {r['max_running_requests']} requests run at once")
    if d.engine.speculative.algorithm == "DDTREE":
        assert ddtree_violations(r["page_size"], r["attention_backend"], d.engine.speculative.tree_size,
                                 d.engine.speculative.num_draft_tokens) == []


def test_real_sglang_refuses_the_bad_combinations(real, repos):
    refused = {name: real[name].get("error") for name in bad_cases(repos)}
    assert all(refused.values()), refused
    assert "Blackwell" in refused["trtllm_mla on a Hopper GPU"]
    assert "--speculative-draft-model-path" in refused["no drafter"]


@pytest.mark.parametrize("combo", OWN_COMBOS, ids=[f"{c}-{p}" for c, p in OWN_COMBOS])
def test_real_sglang_resolves_the_profiles_without_a_drafter_as_the_deploy_expects(combo, real, repos):
    """qwen36_mtp drafts through EAGLE with the target's own layer (no drafter path), its chain as the profile
    says; qwen36_ar speculates not at all."""
    d = deployment(*combo, repos)
    result = real[combo]
    assert "error" not in result, f"real SGLang 0.5.23 refuses {combo}: {result['error']}"
    r, spec = result["resolved"], d.engine.speculative
    assert (r["attention_backend"], r["tp_size"]) == (d.engine.attention_backend, d.engine.tp_size)
    assert r["speculative_algorithm"] == (spec.entry.sglang_name if spec.entry.drafts else None)
    assert r["speculative_draft_model_path"] is None
    if spec.entry.drafts:
        assert r["speculative_draft_attention_backend"] == d.engine.draft_attention_backend
        # What /server_info reports of it: the settings the profile renders, none moved by the engine.
        assert {key: r[key] for key in spec.entry.server_info} == {
            "speculative_algorithm": "EAGLE", "speculative_num_draft_tokens": spec.num_draft_tokens,
            **{f"speculative_{key}": value for key, value in spec.values.items()}}


def mtp_with(host_class: str, num_draft_tokens: int, backend: str | None = None, page_size: int | None = None,
             **values):
    """qwen36_mtp on `host_class` drafting these settings, on `backend` with pages of `page_size` asked."""
    def server(repos):
        d = deployment(host_class, "qwen36_mtp", repos)
        args = (*d.engine.extra_args, *(("--page-size", str(page_size)) if page_size else ()))
        return replace(d, engine=replace(d.engine, speculative=Speculative("MTP", num_draft_tokens, values),
                                         attention_backend=backend or d.engine.attention_backend, extra_args=args))
    return server


def ngram_with(host_class: str, page_size: int | None, **values):
    """qwen36_ar on `host_class` drafting n-grams (8 draft tokens), with pages of `page_size` asked."""
    def server(repos):
        d = deployment(host_class, "qwen36_ar", repos)
        args = (*d.engine.extra_args, *(("--page-size", str(page_size)) if page_size else ()))
        return replace(d, engine=replace(d.engine, speculative=Speculative("NGRAM", 8, values), extra_args=args))
    return server


# The combinations of the new entries' settings the deploy's rules judge, and what the real release makes of each:
# refused with these words (the deploy's rule's sentence is the engine's), or None where it resolves them
# (the draft tokens it serves then).
RULE_CASES = {
    "mtp chain verifying 5 of 3 steps": (mtp_with("h100_sxm", 5, num_steps=3, eagle_topk=1), None),
    "mtp without steps": (mtp_with("h100_sxm", 4), "AssertionError"),
    "mtp tree on trtllm_mha": (mtp_with("b200_nvlink", 8, "trtllm_mha", num_steps=3, eagle_topk=4),
                               "trtllm_mha backend only supports topk = 1 for speculative decoding."),
    "mtp tree on paged fa3": (mtp_with("h100_sxm", 8, page_size=16, num_steps=3, eagle_topk=4), None),
    "ngram trie on paged fa3": (ngram_with("h100_sxm", 16), "speculative_eagle_topk(10) > 1 with page_size(16) > 1"),
    "ngram chain on paged fa3": (ngram_with("h100_sxm", 16, ngram_max_bfs_breadth=1), None),
    "ngram trie on one-token pages": (ngram_with("h100_sxm", None), None),
}


@pytest.mark.parametrize("name", list(RULE_CASES))
def test_the_deploys_rules_of_mtp_and_ngram_are_the_real_releases(name, real, repos):
    """Each rule preflight holds an MTP or NGRAM profile to (speculative.py eagle_rules, ngram_rules) against
    the real 0.5.23 resolving the same command line: it refuses where the rule does, in the words the rule
    quotes; where the rule refuses a chain whose draft tokens the engine would move, the engine resolves it
    to steps + 1, not what the profile says."""
    server, refused = RULE_CASES[name]
    d = server(repos)
    said, answer = rendered_ddtree_violations(d), real[name]
    spec = d.engine.speculative
    if refused is None and not said:
        assert "error" not in answer, answer["error"]
        assert answer["resolved"]["speculative_num_draft_tokens"] == spec.num_draft_tokens
    elif refused is None:  # the engine moves the setting, with a warning
        assert "error" not in answer, answer["error"]
        assert answer["resolved"]["speculative_num_draft_tokens"] == spec.values["num_steps"] + 1 \
            != spec.num_draft_tokens
        assert said == [f"speculative_num_draft_tokens is adjusted to speculative_num_steps + 1 when "
                        f"speculative_eagle_topk == 1 ({spec.num_draft_tokens} != {spec.values['num_steps']} + 1): "
                        f"set num_draft_tokens {spec.values['num_steps'] + 1}"]
    else:
        assert answer.get("error", "").startswith(("ValueError: " + refused, refused)), answer
        assert said and (refused == "AssertionError" or answer["error"] == f"ValueError: {said[0]}"), (said, answer)


def test_ddtree_rules():
    """PR #29907: a budget <= draft tokens - 1 verifies one chain (spine mode) on any backend of one-token
    pages; only a larger budget builds a tree, and only the tree verify is triton-only."""
    assert ddtree_violations(1, "triton", 15, 16) == []
    assert ddtree_violations(1, "flashinfer", 15, 16) == []  # spine mode: no tree, no triton needed
    assert ddtree_violations(1, "flashinfer", None, 16) == []  # the PR's default budget, draft tokens - 1
    assert ddtree_violations(1, "triton", 16, 8) == []
    assert ddtree_violations(1, "flashinfer", 16, 8) == [  # tree mode off triton
        "DDTREE tree mode (budget 16 > draft tokens - 1 = 7) needs the target attention backend triton, not "
        "flashinfer"]
    # What trtllm_mha on SM100 resolves to: it forces the page size to 64.
    assert [p.split(" (")[0] for p in ddtree_violations(64, "trtllm_mha", 15, 16)] == [
        "DDTREE currently supports only page_size == 1"]
    assert ddtree_violations(1, "triton", 0, 16) and ddtree_violations(1, "triton", 1025, 16)


def test_triton_only_where_ddtree_builds_a_tree():
    assert not ddtree_builds_tree(16, 15) and not ddtree_builds_tree(16, None) and ddtree_builds_tree(16, 16)
    assert ddtree_target_backend("flashinfer", 16, 15) == "flashinfer"
    assert ddtree_target_backend("flashinfer", 8, 16) == "triton"
    assert ddtree_target_backend("trtllm_mla", 8, 7) == "triton"  # it forces pages of 32/64
    for host_class in HOST_CLASSES:
        spine = resolve(host_data(host_class, profile="qwen36_ddtree"), host_class).replicas[0]
        tree = resolve(host_data(host_class, profile="kimi_k26_ddtree"), host_class).replicas[0]
        assert spine.engine.attention_backend == host_data(host_class).sglang_tuning["attention_backends"]["mha"][0]
        assert spine.engine.attention_backend != "triton" and tree.engine.attention_backend == "triton"
        assert ddtree_builds_tree(tree.engine.speculative.num_draft_tokens, tree.engine.speculative.tree_size)
        assert not ddtree_builds_tree(spine.engine.speculative.num_draft_tokens, spine.engine.speculative.tree_size)


def test_the_deploy_holds_ddtree_profiles_to_the_rules(repos):
    for host_class in HOST_CLASSES:
        assert rendered_ddtree_violations(deployment(host_class, "qwen36_ddtree", repos)) == []
        assert rendered_ddtree_violations(deployment(host_class, "kimi_k26_ddtree", repos)) == []
        assert rendered_ddtree_violations(deployment(host_class, "kimi_k26_ddtree", repos,
                                                     attention_backend="flashinfer"))
        assert rendered_ddtree_violations(deployment(host_class, "kimi_k26_dflash", repos)) == []
    assert rendered_ddtree_violations(old_ddtree_deployment(repos))  # trtllm_mha


def test_standin_ddtree_rules_are_the_deploys():
    """The DDTree build runs on hosts without operations/: its copy of the constants must match."""
    namespace = runpy.run_path(str(STANDIN_SRC / "sglang" / "srt" / "resolution.py"))
    budget = DDTREE.settings[DDTREE.tree]
    assert namespace["DDTREE_TREE_BACKENDS"] == DDTREE.tree_backends
    assert namespace["DDTREE_BUDGET_RANGE"] == (budget.low, budget.high)
    # Its names: each released algorithm of the table is one the release knows; DDTree is the build's own.
    released = {a.sglang_name for a in ALGORITHMS.values() if a.drafts and a.pull_request is None}
    assert released <= namespace["KNOWN_ALGORITHMS"] and DDTREE.name not in namespace["KNOWN_ALGORITHMS"]
    assert namespace["EAGLE_PAGED_TREE_BACKENDS"] == EAGLE_PAGED_TREE_BACKENDS


def test_pcie_nccl_settings_follow_nccl_and_leave_p2p_to_each_hosts_smoke_test():
    env = host_data("rtx_pro_6000_pcie").sglang_tuning["env"]
    assert "LL128" not in env.get("NCCL_PROTO", "").replace("^LL128", "")
    assert "NCCL_P2P_DISABLE" not in env and "NCCL_P2P_LEVEL" not in env


@pytest.mark.parametrize("host_class", HOST_CLASSES)
def test_dflash_profiles_let_the_drafter_take_the_target_context(host_class):
    for profile in PROFILES:
        d = deployment(host_class, profile, repos={r: r for r in _real_repo_ids()})
        assert (d.engine.env.get("SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN") == "1"
                or "--context-length" in d.engine.extra_args), f"{profile} on {host_class}"


def _real_repo_ids() -> list[str]:
    profiles = host_data("b200_nvlink").profiles.values()
    return [p[role]["repo"] for p in profiles for role in ("target", "drafter") if role in p]


# --- the stand-in agrees --------------------------------------------------


def standin_resolve(case: dict, tmp: Path, src: Path = STANDIN_SRC) -> dict:
    """RESOLVE run against the stand-in, with the GPU stand-in's nvidia-smi showing the case's GPU."""
    profile = next(p.name for p in GPU_PROFILES.iterdir() if (p / "profile.json").is_file() and json.loads(
        (p / "profile.json").read_text())["gpus"][0]["name"] == case["gpu"]["name"])
    env = {**os.environ, **case["env"], "PYTHONPATH": str(src), **gpu_standin_env(tmp, profile)}
    proc = subprocess.run([sys.executable, "-c", RESOLVE, json.dumps(case["argv"])], env=env,
                          capture_output=True, text=True, check=True)
    return json.loads(proc.stdout.split("@@RESOLVED@@")[1])


def test_standin_and_real_resolution_agree(cases, real, tmp_path):
    for name, c in cases.items():
        mine, theirs = standin_resolve(c, tmp_path), real[name]
        assert ("error" in mine) == ("error" in theirs), f"{name}: stand-in {mine.get('error')!r}, real {theirs.get('error')!r}"
        if "resolved" in theirs:
            assert {k: mine["resolved"][k] for k in KEYS} == {k: theirs["resolved"][k] for k in KEYS}, name


# What /server_info reports of the new entries beyond KEYS: their settings and what their resolution moves.
DRAFTERLESS_KEYS = (*KEYS, "speculative_draft_model_path", "speculative_ngram_max_bfs_breadth", "enable_mixed_chunk",
                    "mamba_radix_cache_strategy", "disable_overlap_schedule")


def test_standin_resolves_the_profiles_without_a_drafter_and_the_rule_cases_field_by_field_as_the_release(
        cases, real, tmp_path):
    """MTP (through EAGLE), NGRAM and AR as the lab's stand-in resolves them, every field /server_info reports
    of them equal to the real 0.5.23's, and its refusals where the release refuses."""
    for name in [*OWN_COMBOS, *RULE_CASES]:
        mine, theirs = standin_resolve(cases[name], tmp_path), real[name]
        assert ("error" in mine) == ("error" in theirs), (name, mine.get("error"), theirs.get("error"))
        if "error" in theirs:
            assert mine["error"].split(":")[0] == theirs["error"].split(":")[0], (name, mine["error"], theirs["error"])
            continue
        assert {k: mine["resolved"][k] for k in DRAFTERLESS_KEYS} == \
            {k: theirs["resolved"][k] for k in DRAFTERLESS_KEYS}, name


@pytest.fixture(scope="module")
def ddtree_src(tmp_path_factory) -> Path:
    """The stand-in's DDTree build, unpacked as the wheel installs it."""
    import zipfile

    from lab.index import build_standin_wheel

    out = tmp_path_factory.mktemp("ddtree")
    zipfile.ZipFile(build_standin_wheel("0.5.23+lab.ddtree29907", out)).extractall(out / "site")
    return out / "site"


def test_ddtree_standin_refuses_what_the_release_plus_ddtree_rules_refuse(repos, real, ddtree_src, tmp_path):
    """Today's DDTree profile on B200 and the old one (trtllm_mha, page size 1 asked): the real
    release resolves the DFlash base, the deploy's DDTree rules judge it; the DDTree build agrees."""
    from deployment.server.command_line import server_args

    good, old = deployment("b200_nvlink", "qwen36_ddtree", repos), old_ddtree_deployment(repos)
    real_good, real_old = real[("b200_nvlink", "qwen36_ddtree")], real[OLD_DDTREE]
    budget = good.engine.speculative.tree_size
    blocks = good.engine.speculative.num_draft_tokens
    assert ddtree_violations(real_good["resolved"]["page_size"], real_good["resolved"]["attention_backend"], budget,
                             blocks) == []
    assert real_old["resolved"]["page_size"] == 64  # trtllm_mha overrode the profile's --page-size 1
    assert ddtree_violations(real_old["resolved"]["page_size"], "trtllm_mha", budget, blocks)
    for d, refused in ((good, False), (old, True)):
        answer = standin_resolve({**case(d), "argv": server_args(d)}, tmp_path, src=ddtree_src)
        assert ("error" in answer) == refused, answer.get("error")
        if not refused:
            assert answer["resolved"]["speculative_ddtree_budget"] == budget
    assert "page_size == 1" in standin_resolve({**case(old), "argv": server_args(old)}, tmp_path, src=ddtree_src)["error"]


def test_ddtree_standin_wants_triton_only_for_a_tree(repos, real, ddtree_src, tmp_path):
    """Spine mode (Qwen, budget 15 of 16) on the class's flashinfer and a tree (Kimi, budget 16 of 8) on
    triton: the real release resolves both bases, the deploy's rules and the DDTree build accept them;
    the tree on flashinfer is refused by both."""
    from deployment.server.command_line import server_args

    for host_class in HOST_CLASSES:
        spine, tree = deployment(host_class, "qwen36_ddtree", repos), deployment(host_class, "kimi_k26_ddtree", repos)
        off_triton = deployment(host_class, "kimi_k26_ddtree", repos, attention_backend="flashinfer")
        for d, refused in ((spine, False), (tree, False), (off_triton, True)):
            if d is not off_triton:
                r = real[(host_class, d.engine.profile_name)]["resolved"]
                assert ddtree_violations(r["page_size"], r["attention_backend"], d.engine.speculative.tree_size,
                                         d.engine.speculative.num_draft_tokens) == []
            answer = standin_resolve({**case(d), "argv": server_args(d)}, tmp_path, src=ddtree_src)
            assert ("error" in answer) == refused, (host_class, d.profile_name, answer.get("error"))
            assert (answer.get("error") or "").removeprefix("ValueError: ") == \
                next(iter(rendered_ddtree_violations(d)), "")


def test_committed_flag_lists_are_the_real_wheels(tmp_path):
    """lab/sglang_standin/extract_flags.py, re-run against the real wheel, writes the committed files."""
    subprocess.run([sys.executable, str(STANDIN_SRC / "extract_flags.py"), str(tmp_path)], cwd=REPO, check=True,
                   capture_output=True)
    for name in ("flags_0_5_23.json", "flags_0_5_23_ddtree.json"):
        assert (tmp_path / name).read_text() == (STANDIN_SRC / "sglang" / name).read_text(), (
            f"{name} differs from the real sglang 0.5.23 wheel's flags: re-run extract_flags.py")
