"""What a deployment may be tuned to (tuning/candidates.py): the algorithm table's tried settings
(deployment/server/speculative.py) at each layout its GPUs divide into, each resolved and judged by the
deploy's own rules (layout, rendered flags, release builds, weights and KV plan); facts in (host data, the
hub's snapshots, the host's GPUs), candidates and the reasons for those left out."""

from pyinfra.context import ctx_host

from deployment.server import speculative
from deployment.server.command_line import server_args
from tests.unit.fakehost import FakeHost
from tests.unit.group_data import class_expectations, host_data
from tests.unit.test_capacity import snapshots as kimi_snapshots
from tuning.candidates import candidates

PCIE = "rtx_pro_6000_pcie"


def value(args: list[str], flag: str) -> str | None:
    return args[args.index(flag) + 1] if flag in args else None


def test_the_table_says_what_each_algorithm_tries():
    ddtree = speculative.DDTREE.tried(16, {"draft_window_size": 4096})
    assert [(s.num_draft_tokens, s.values) for s in ddtree] == [
        (16, {"ddtree_budget": b}) for b in (3, 7, 11, 15, 31, 63, 127)]  # its spine default, 15, among them
    dflash = speculative.DFLASH.tried(8, {"draft_window_size": 4096, "ddtree_budget": 7})
    assert [(s.num_draft_tokens, s.values) for s in dflash] == [(4, {"draft_window_size": 4096}),
                                                                 (8, {"draft_window_size": 4096})]
    assert [s.values["ddtree_budget"] for s in speculative.DDTREE.tried(4, {})] == [3, 7, 11, 31, 63, 127]


def test_qwen36_on_the_pcie_class_tries_every_setting_at_every_layout_its_gpus_divide_into():
    found, left_out = candidates(host_data(PCIE, profile="qwen36_ddtree"), PCIE, "qwen36_ddtree",
                                 algorithms=("dflash", "ddtree"))
    baseline, *tried = found
    assert baseline.baseline and baseline.label == "AR TP1x8" and "--speculative-algorithm" not in \
        server_args(baseline.deployment.replicas[0])
    layouts = sorted({(c.deployment.engine.tp_size, len(c.deployment.replicas)) for c in tried})
    assert layouts == [(1, 8), (2, 4), (4, 2), (8, 1)] and len(tried) == 4 * (4 + 7)
    assert [line.split(":")[0] for line in left_out] == ["tp_size 3", "tp_size 5", "tp_size 6", "tp_size 7"]
    assert "8 GPUs do not make replicas of tp_size 3" in left_out[0]
    for c in tried:  # each renders the flags its settings say, as the deploy would from a tuned file
        args = server_args(c.deployment.replicas[0])
        assert value(args, "--speculative-num-draft-tokens") == str(c.settings["num_draft_tokens"])
        assert value(args, "--speculative-ddtree-budget") == (str(c.settings["ddtree_budget"])
                                                              if "ddtree_budget" in c.settings else None)
        assert value(args, "--tp-size") == str(c.settings["tp_size"])
    tree = [c for c in tried if c.settings.get("ddtree_budget", 0) > 15]
    assert tree and all(c.settings["attention_backend"] == "triton" for c in tree)  # the tree verify's backend
    assert all(value(server_args(c.deployment.replicas[0]), "--attention-backend") == "flashinfer"
               for c in tried if c not in tree)


def test_an_algorithm_the_rules_refuse_is_left_out_in_the_engines_words():
    """With pages of 16 tokens DDTree is refused by the rules the deploy holds it to; DFlash still runs."""
    data = host_data(PCIE, profile="qwen36_ddtree")
    profile = data.profiles["qwen36_ddtree"]
    args = profile["server_args"]
    profile["server_args"] = [*args[:args.index("--page-size") + 1], "16", *args[args.index("--page-size") + 2:]]
    found, left_out = candidates(data, PCIE, "qwen36_ddtree", algorithms=("dflash", "ddtree"))
    assert {c.settings["algorithm"] for c in found[1:]} == {"DFLASH"}
    assert any("DDTREE currently supports only page_size == 1" in line for line in left_out)


def test_a_release_build_leaves_ddtree_out_and_the_weights_leave_out_the_layouts_they_do_not_fit():
    # Kimi without its DDTree profile: DDTree is tried with the DFlash drafter of the release build deployed.
    shipped = host_data(PCIE).profiles
    data = host_data(PCIE, profile="kimi_k26_dflash",
                     profiles={name: p for name, p in shipped.items() if name != "kimi_k26_ddtree"})
    gpus = [{"index": i, "memory_total_mib": 97887} for i in range(8)]
    with ctx_host.use(FakeHost({})):
        found, left_out = candidates(data, PCIE, "kimi_k26_dflash", class_expectations(PCIE), kimi_snapshots(595, 6),
                                     gpus)
    assert [c.label for c in found] == ["AR TP8x1", "DFLASH n=4 draft_window_size=4096 TP8x1",
                                        "DFLASH n=8 draft_window_size=4096 TP8x1"]
    assert any(line.endswith("is a release without DDTree") for line in left_out)
    assert any(line.startswith("DFLASH n=8 draft_window_size=4096 TP4x2: host-1: kimi-k2.6 and its drafter need ")
               for line in left_out)


def test_a_hosts_own_layout_is_every_candidates_one():
    data = host_data(PCIE, deployments=[{"profile": "qwen36_ddtree", "tp_size": 2}])
    found, _ = candidates(data, PCIE, "qwen36_ddtree", algorithms=("dflash", "ddtree"))
    assert {c.shape for c in found} == {(2, 4)} and len(found) == 1 + 4 + 7


QWEN = {"target": {"repo": "Qwen/Qwen3.6-27B", "revision": "main"}, "attention": "mha",
        "served_model_name": "qwen3.6-27b", "server_args": ["--trust-remote-code"],
        "sglang": {"requirement": "sglang==0.5.23", "version": "0.5.23"},
        "env": {"SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN": "1"}}


def compared_profiles(**data):
    """qwen36_ddtree deployed beside three more profiles of its model: one without speculation, one naming DFlash
    with the same drafter on a release build, one DFlash with a drafter the host does not hold."""
    dflash = {**QWEN, "drafter": {"repo": "z-lab/Qwen3.6-27B-DFlash", "revision": "main"},
              "speculative": {"algorithm": "DFLASH", "num_draft_tokens": 16}}
    other = {**dflash, "drafter": {"repo": "someone/Qwen3.6-27B-Other-DFlash", "revision": "main"}}
    profiles = {"qwen36_ddtree": host_data(PCIE).profiles["qwen36_ddtree"], "qwen36_plain": QWEN,
                "qwen36_dflash": dflash, "qwen36_other": other}
    return host_data(PCIE, profile="qwen36_ddtree", profiles=profiles, **data)


def test_the_tuner_compares_every_profile_of_the_model_that_the_host_can_serve():
    found, left_out = candidates(compared_profiles(), PCIE, "qwen36_ddtree")
    baseline, *tried = found
    # The baseline is the model's profile that drafts nothing, at the layout deployed.
    assert baseline.baseline and baseline.label == "AR TP1x8 (qwen36_plain)"
    assert baseline.settings == {"profile": "qwen36_plain", "algorithm": "AR", "num_draft_tokens": 1, "tp_size": 1,
                                 "replicas": 8}
    assert not [arg for arg in server_args(baseline.deployment.replicas[0]) if arg.startswith("--speculative")]
    # DFlash from the profile that names it (its release build), DDTree from the deployed one; each candidate's
    # settings name its profile, which the tuned file keeps.
    by_profile = {(c.settings["profile"], c.settings["algorithm"]) for c in tried}
    assert by_profile == {("qwen36_dflash", "DFLASH"), ("qwen36_ddtree", "DDTREE")}
    dflash = next(c for c in tried if c.settings["algorithm"] == "DFLASH")
    assert dflash.label.endswith(" (qwen36_dflash)") and dflash.deployment.engine.sglang_requirement == "sglang==0.5.23"
    assert dflash.kind[0] == "qwen36_dflash" and dflash.deployment.name == "qwen36_ddtree"
    # The profile whose drafter the host does not hold is left out once, saying what to do.
    (missing,) = [line for line in left_out if "qwen36_other" in line]
    assert missing.startswith("DFLASH (qwen36_other): its drafter someone/Qwen3.6-27B-Other-DFlash is not on the host")


def test_the_algorithms_asked_are_the_only_ones_compared():
    found, _ = candidates(compared_profiles(), PCIE, "qwen36_ddtree", algorithms=("ddtree",))
    assert {c.settings["algorithm"] for c in found[1:]} == {"DDTREE"}
    # Without ar among them the baseline is still measured: the deployed profile without its speculative flags.
    assert found[0].baseline and found[0].label == "AR TP1x8" and found[0].settings == {}
