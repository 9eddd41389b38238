"""The table of speculative algorithms (deployment/server/speculative.py): a new algorithm is one entry,
which the configuration, the flags, the checks and the bench pick up; the names live there alone
(tests/unit/test_imports.py holds that)."""

from dataclasses import replace

import pytest
from pyinfra.context import ctx_host

from deployment import site_data
from deployment.hosts import resolve
from deployment.knobs import BadHostData
from deployment.server import speculative
from deployment.server.command_line import rendered_violations, server_args
from deployment.server.speculative import Algorithm, Resolved, Setting
from operations.server.checks import refused_flags, rule_problems, unreleased_problems
from serving_benchmark.modes import mode_args
from serving_benchmark.plan import plan
from tests.unit.fakehost import FakeHost
from tests.unit.group_data import host_data

# A tree-verifying algorithm of a pull request, as EAGLE-3's or DFlash2's entry would be written.
FAKE = Algorithm("FAKETREE", settings={"fake_width": Setting("--speculative-fake-width", 1, 64)}, page_size=1,
                 tree="fake_width", tree_backends=("triton",), pull_request=12345, base="DFLASH", label="FakeTree",
                 build="sglang @ git+https://github.com/sgl-project/sglang@COMMIT#subdirectory=python")


def server_of(speculative_settings: dict, requirement: str | None = None, host_class: str = "b200_nvlink"):
    """The qwen36_ddtree profile's server (one-token pages asked, the class's mha backend) with these
    speculative settings (and SGLang requirement)."""
    data = host_data(host_class, profile="qwen36_ddtree")
    profile = data.profiles["qwen36_ddtree"]
    profile["speculative"] = speculative_settings
    if requirement is not None:
        profile["sglang"] = {**profile["sglang"], "requirement": requirement}
    return resolve(data, host_class).replicas[0]


def value_after(args: list[str], flag: str) -> str:
    return args[args.index(flag) + 1]


def test_a_new_algorithm_is_one_entry(monkeypatch):
    monkeypatch.setitem(speculative.ALGORITHMS, FAKE.name, FAKE)
    server = server_of({"algorithm": "FAKETREE", "num_draft_tokens": 16, "fake_width": 20})
    # The configuration takes its setting, the flags render it.
    args = server_args(server)
    assert value_after(args, "--speculative-algorithm") == "FAKETREE"
    assert value_after(args, "--speculative-fake-width") == "20"
    # Its rules: a tree (20 > 16 - 1) off its tree backend is refused in its words.
    assert server.engine.attention_backend != "triton"
    assert rendered_violations(server) == [
        f"FAKETREE tree mode (budget 20 > draft tokens - 1 = 15) needs the target attention backend triton, not "
        f"{server.engine.attention_backend}"]
    assert rendered_violations(replace(server, engine=replace(server.engine, attention_backend="triton"))) == []
    # The bench serves it as a mode of its own, with its rules' backend and pages.
    assert plan({"modes": "ar,faketree"}).modes == ("ar", "faketree")
    bench = mode_args(server, "faketree")
    assert value_after(bench, "--speculative-fake-width") == "20"
    assert value_after(bench, "--attention-backend") == "triton"
    assert "--speculative-fake-width" not in mode_args(server, "dflash")
    # The checks: in no release, so a release pin is refused naming it and its pull request.
    released = server_of({"algorithm": "FAKETREE", "num_draft_tokens": 16}, requirement="sglang==0.5.23")
    with ctx_host.use(FakeHost({})):
        [problem] = unreleased_problems(released)
        assert "uses FakeTree, but sglang==0.5.23 is a release" in problem
        assert "(it is in open pull request #12345)" in problem
        assert "at a FakeTree build (PR #12345)" in refused_flags(released, "why")
    # Unset, its tree setting is the spine default in the bench's mode, a chain on the class's backend.
    spine = mode_args(released, "faketree")
    assert value_after(spine, "--speculative-fake-width") == "15"
    assert value_after(spine, "--attention-backend") == released.engine.attention_backend


def chain_rule(resolved: Resolved) -> str | None:
    """A rule of the shape EAGLE's post-init holds: one candidate a step verifies steps + 1 tokens, and
    several need one-token pages off triton."""
    steps, topk = resolved.values.get("fake_steps", 1), resolved.values.get("fake_topk", 1)
    if topk == 1 and resolved.num_draft_tokens != steps + 1:
        return f"FAKECHAIN with topk 1 verifies steps + 1 = {steps + 1} tokens, not {resolved.num_draft_tokens}"
    if topk > 1 and resolved.page_size != 1 and resolved.attention_backend != "triton":
        return f"FAKECHAIN topk {topk} needs page_size 1 or triton, not {resolved.attention_backend}"
    return None


# A chain-drafting algorithm whose tuner varies two settings and whose engine holds a rule of its own.
CHAIN = Algorithm("FAKECHAIN", settings={"fake_steps": Setting("--speculative-fake-steps", 1, 8, tried=(2, 4, 9)),
                                         "fake_topk": Setting("--speculative-fake-topk", 1, 8, tried=(1, 4))},
                  rules=(chain_rule,))


def test_an_algorithm_entry_carries_its_own_rules_and_the_settings_a_tuner_varies(monkeypatch):
    monkeypatch.setitem(speculative.ALGORITHMS, CHAIN.name, CHAIN)
    server = server_of({"algorithm": "FAKECHAIN", "num_draft_tokens": 4, "fake_steps": 2, "fake_topk": 1})
    args = server_args(server)
    assert (value_after(args, "--speculative-fake-steps"), value_after(args, "--speculative-fake-topk")) == ("2", "1")
    assert rendered_violations(server) == ["FAKECHAIN with topk 1 verifies steps + 1 = 3 tokens, not 4"]
    assert rendered_violations(server_of({"algorithm": "FAKECHAIN", "num_draft_tokens": 3, "fake_steps": 2})) == []
    # The rule sees the page size and the backend the deploy renders (qwen36_ddtree asks one-token pages).
    tree = server_of({"algorithm": "FAKECHAIN", "num_draft_tokens": 8, "fake_steps": 2, "fake_topk": 4})
    assert rendered_violations(tree) == []
    paged = replace(tree, engine=replace(tree.engine, extra_args=("--page-size", "16")))
    assert rendered_violations(paged) == [f"FAKECHAIN topk 4 needs page_size 1 or triton, not "
                                          f"{tree.engine.attention_backend}"]
    # The tuner tries every combination of its settings' tried values within their bounds (9 > 8 is not).
    assert [(s.num_draft_tokens, s.values) for s in CHAIN.tried(4, {})] == [
        (4, {"fake_steps": steps, "fake_topk": topk}) for steps in (2, 4) for topk in (1, 4)]


def test_ddtree_in_a_release_is_refused_before_any_host_changes():
    """The deploy's sentence for a DDTree profile pinned to a release (the lab's test_deploy sees it
    on a host)."""
    server = server_of({"algorithm": "DDTREE", "num_draft_tokens": 16, "ddtree_budget": 15},
                       requirement="sglang==0.5.23")
    with ctx_host.use(FakeHost({})):
        [problem] = unreleased_problems(server)
        assert "(why); point profiles['qwen36_ddtree']['sglang']['requirement'] at a DDTree build (PR #29907); " \
            in refused_flags(server, "why")
        dflash = replace(server.engine, speculative=server.engine.speculative.as_mode("dflash"))
        assert unreleased_problems(replace(server, engine=dflash)) == []
    assert "no SGLang release up to 0.5.23 has DDTree (it is in open pull request #29907)" in problem
    assert "'sglang @ git+https://github.com/sgl-project/sglang@COMMIT#subdirectory=python'" in problem


@pytest.mark.parametrize("name", ["EAGLE", "AR", "dflash", "DFLASH; rm -rf /"])
def test_a_profile_names_a_drafting_algorithm_of_the_table(name):
    with pytest.raises(BadHostData) as refused:
        server_of({"algorithm": name, "num_draft_tokens": 16})
    assert str(refused.value) == (f"profiles['qwen36_ddtree']['speculative']['algorithm']={name!r} is not accepted: "
                                  "use an SGLang algorithm name the deploy knows: DFLASH or DDTREE or MTP or EAGLE3 "
                                  "or NGRAM")


def test_a_profile_takes_the_settings_of_the_table_alone():
    with pytest.raises(BadHostData, match=r"optionally draft_window_size, ddtree_budget, num_steps, eagle_topk, "
                                          r"ngram_max_bfs_breadth$"):
        server_of({"algorithm": "DFLASH", "num_draft_tokens": 16, "topk": 4})


def test_the_server_info_fields_of_each_algorithm():
    assert speculative.AR.server_info == ()
    assert speculative.DDTREE.server_info == ("speculative_algorithm", "speculative_num_draft_tokens",
                                              "speculative_ddtree_budget")
    assert speculative.MTP.server_info == ("speculative_algorithm", "speculative_num_draft_tokens",
                                           "speculative_num_steps", "speculative_eagle_topk")
    assert speculative.NGRAM.server_info == ("speculative_algorithm", "speculative_num_draft_tokens",
                                             "speculative_ngram_max_bfs_breadth")


@pytest.mark.parametrize("host_class", site_data.host_classes())
def test_qwen36_mtp_drafts_with_the_models_own_layer_through_eagle_and_fetches_no_drafter(host_class):
    """The model card's MTP command (--speculative-algorithm NEXTN, EAGLE to the engine), no drafter path: the
    draft worker loads the target's checkpoint as its MTP form."""
    d = resolve(host_data(host_class, profile="qwen36_mtp"), host_class)
    args = server_args(d.replicas[0])
    assert [w.role for w in d.weights.repos] == ["target"] and d.weights.drafter is None
    assert d.engine.draft_model_dir is None and "--speculative-draft-model-path" not in args
    assert [value_after(args, flag) for flag in ("--speculative-algorithm", "--speculative-num-draft-tokens",
                                                 "--speculative-num-steps", "--speculative-eagle-topk")] == \
        ["EAGLE", "4", "3", "1"]
    assert value_after(args, "--speculative-draft-attention-backend") == d.engine.draft_attention_backend
    assert rendered_violations(d.replicas[0]) == []
    ar = resolve(host_data(host_class, profile="qwen36_ar"), host_class)
    assert ar.weights.drafter is None and not [a for a in server_args(ar.replicas[0]) if a.startswith("--speculative")]


def ngram(host_class: str, page_size: int | None, **values) -> object:
    """Qwen3.6-27B drafting n-grams on `host_class` (its MHA backend), with pages of `page_size` tokens asked."""
    data = host_data(host_class, profile="qwen36_ar")
    profile = data.profiles["qwen36_ar"]
    profile["speculative"] = {"algorithm": "NGRAM", "num_draft_tokens": 8, **values}
    profile["server_args"] = [*profile["server_args"], *(["--page-size", str(page_size)] if page_size else [])]
    return resolve(data, host_class).replicas[0]


def mtp(backend: str | None = None, page_size: int | None = None, **speculative_settings) -> object:
    """The qwen36_mtp profile's server on an H100 host with these speculative settings, on `backend` (else
    the class's) with pages of `page_size` tokens asked."""
    data = host_data("h100_sxm", profile="qwen36_mtp")
    profile = data.profiles["qwen36_mtp"]
    profile["speculative"] = {"algorithm": "MTP", **speculative_settings}
    profile.update({"attention_backend": backend} if backend else {})
    profile["server_args"] = [*profile["server_args"], *(["--page-size", str(page_size)] if page_size else [])]
    return resolve(data, "h100_sxm").replicas[0]


@pytest.mark.parametrize("server, said", [
    (lambda: mtp(num_draft_tokens=5, num_steps=3, eagle_topk=1),
     "speculative_num_draft_tokens is adjusted to speculative_num_steps + 1 when speculative_eagle_topk == 1 "
     "(5 != 3 + 1): set num_draft_tokens 4"),
    (lambda: mtp(num_draft_tokens=4),
     "speculative_num_steps and speculative_eagle_topk must be set with speculative_num_draft_tokens "
     "(_handle_eagle_family asserts speculative_eagle_topk is None and speculative_num_draft_tokens is None when "
     "speculative_num_steps is unset): set num_steps and eagle_topk"),
    (lambda: mtp("trtllm_mha", num_draft_tokens=8, num_steps=3, eagle_topk=4),
     "trtllm_mha backend only supports topk = 1 for speculative decoding."),
    (lambda: mtp("flashmla", 64, num_draft_tokens=8, num_steps=3, eagle_topk=4),
     "speculative_eagle_topk > 1 with page_size > 1 is only supported on ('flashinfer', 'fa3', 'triton'); got "
     "attention_backend='flashmla'. Use page_size == 1 or one of those backends."),
    (lambda: ngram("h100_sxm", 16),
     "speculative_eagle_topk(10) > 1 with page_size(16) > 1 is unstable and produces incorrect results for paged "
     "attention backends. This combination is only supported for the 'flashinfer' backend."),
], ids=["mtp-chain-draft-tokens", "mtp-no-steps", "mtp-tree-on-trtllm_mha", "mtp-paged-tree-off-its-backends",
        "ngram-paged-trie-on-fa3"])
def test_preflight_refuses_what_the_engine_refuses_of_the_settings_in_one_line_quoting_it(server, said):
    """Facts in (the profile's settings on a class), preflight's sentence out: the engine's own words
    (0.5.23 srt/arg_groups/speculative_hook.py _handle_eagle_family, _handle_ngram), before anything is
    installed; tests/unit/test_sglang_resolution.py holds the real wheel to the same verdicts."""
    s = server()
    with ctx_host.use(FakeHost({})):
        assert rule_problems(s) == [f"host-1: profile {s.engine.profile_name}: SGLang 0.5.23 would refuse its "
                                    f"{s.engine.speculative.algorithm} settings ({s.service_name}): {said}"]


def test_ngram_renders_no_draft_model_and_runs_where_the_engine_lets_it():
    """No drafter path and no draft backend (no draft model runs); a chain (breadth 1), flashinfer or one-token
    pages are what the engine accepts of it."""
    chain = ngram("h100_sxm", 16, ngram_max_bfs_breadth=1)
    args = server_args(chain)
    assert "--speculative-draft-model-path" not in args and "--speculative-draft-attention-backend" not in args
    assert value_after(args, "--speculative-ngram-max-bfs-breadth") == "1"
    with ctx_host.use(FakeHost({})):
        assert rule_problems(chain) == []
        assert rule_problems(ngram("h100_sxm", None)) == []  # one-token pages, the engine's default
        assert rule_problems(ngram("rtx_pro_6000_pcie", 16)) == []  # flashinfer pages a trie
