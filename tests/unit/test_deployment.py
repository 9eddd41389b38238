"""Resolving a host's deployment and rendering SGLang's command line, checked by the real parser."""

import dataclasses
import json
import re

import pytest

from lab.repos import build_lab_repos
from deployment import hosts, knobs, site_data
from deployment.gateway import config as gateway_config
from deployment.hosts import host_class_of, resolve, resolve_host
from deployment.knobs import BadHostData
from deployment.server import config as server_config
from deployment.server.command_line import server_args, spell
from operations.basics.templates import render
from operations.python.virtualenvs import fingerprint
from operations.server.unit import inputs as unit_inputs, unit_files
from operations.weights.checks import unpinned
from operations.weights.hub import RepoSnapshot
from tests.sglang_real import parse_many_with_real_sglang
from tests.unit.group_data import REPO, host_data

HOST_CLASSES = site_data.host_classes()  # the product's, as the suite runs without a site


def test_window_and_mamba_flags_are_spelled_for_the_pinned_version():
    assert spell("--speculative-draft-window-size", "0.5.11") == "--speculative-dflash-draft-window-size"
    assert spell("--speculative-draft-window-size", "0.5.13") == "--speculative-draft-window-size"
    assert spell("--mamba-radix-cache-strategy", "0.5.13") == "--mamba-scheduler-strategy"
    assert spell("--mamba-radix-cache-strategy", "0.5.23+lab") == "--mamba-radix-cache-strategy"
    data = host_data("rtx_pro_6000_pcie")
    data.profiles["kimi_k26_dflash"]["sglang"]["version"] = "0.5.11"
    assert "--speculative-dflash-draft-window-size" in server_args(resolve(data, "rtx_pro_6000_pcie").replicas[0])


def test_each_class_gets_its_backends_and_environment():
    pcie = resolve(host_data("rtx_pro_6000_pcie"), "rtx_pro_6000_pcie")
    b200 = resolve(host_data("b200_nvlink"), "b200_nvlink").replicas[0]
    assert (pcie.engine.attention_backend, pcie.engine.draft_attention_backend) == ("flashinfer", "flashinfer")
    assert (b200.engine.attention_backend, b200.engine.draft_attention_backend) == ("trtllm_mla", "fa4")
    # P2P is each host's, decided by its GPU smoke test against the PCIe class's P2P floor (smoke.decided_env).
    assert "NCCL_P2P_DISABLE" not in pcie.engine.env and "NCCL_P2P_DISABLE" not in b200.engine.env
    assert pcie.host.smoke.expected.p2p_floor_gbps == 30
    # Each revision in a directory of its own; before the hub resolves the branch, named after it.
    assert pcie.weights.target.local_dir == pcie.engine.model_dir == "/srv/specfleet/models/moonshotai--Kimi-K2.6/main"
    pinned_at = hosts.at_commits(pcie, {"target": "c" * 40, "drafter": "d" * 40})
    assert pinned_at.engine.model_dir == pinned_at.weights.target.local_dir == \
        f"/srv/specfleet/models/moonshotai--Kimi-K2.6/{'c' * 40}"
    assert pinned_at.engine.draft_model_dir == f"/srv/specfleet/models/z-lab--Kimi-K2.6-DFlash/{'d' * 40}"
    # The commits travel one way, in the deployment's weights: what a replica loads and what restarts it.
    assert pcie.weights.commits == {} and pinned_at.weights.commits == {"target": "c" * 40, "drafter": "d" * 40}
    assert f"target={'c' * 12} drafter={'d' * 12} " in unit_inputs(pinned_at.engine, pinned_at.weights.commits)


def test_lab_mirrors_swap_repos_and_ddtree_build_but_keep_paths():
    lab = resolve(host_data("b200_nvlink", lab=True, profile="qwen36_ddtree"), "b200_nvlink")
    assert lab.weights.target.repo_id == "lab/Qwen3.6-27B-tiny" and len(lab.weights.target.revision) == 40
    assert lab.weights.target.local_dir.endswith(f"Qwen--Qwen3.6-27B/{lab.weights.target.revision}")
    assert lab.engine.sglang_requirement.endswith("sglang-0.5.23+lab.ddtree29907-py3-none-any.whl")


def test_lab_pins_are_the_commits_the_lab_hub_builds(tmp_path):
    shas = build_lab_repos(tmp_path)
    data = host_data("b200_nvlink", lab=True)
    for pinned in data.mirrors["repos"].values():
        repo_id, commit = pinned.split("@")
        assert shas[repo_id] == commit, f"lab/group_data/lab.py pins {repo_id} at {commit}, lab/repos.py builds {shas[repo_id]}"


def test_a_host_needs_exactly_one_class_group():
    assert host_class_of(["all", "lab", "b200_nvlink", "b200_nvlink"]) == "b200_nvlink"


def test_rendered_command_lines_parse_with_the_real_sglang_0_5_23():
    kimi = [server_args(resolve(host_data(c), c).replicas[0]) for c in HOST_CLASSES]
    ddtree = server_args(resolve(host_data("b200_nvlink", profile="qwen36_ddtree"), "b200_nvlink").replicas[0])
    # The DDTree profile's mamba strategy, alone: one 0.5.23 itself accepts (the DDTree build extends its parser).
    strategy = ["--model-path", "/srv/m", *ddtree[ddtree.index("--mamba-radix-cache-strategy"):][:2]]
    *results, alone = parse_many_with_real_sglang([*kimi, ddtree, strategy])
    assert alone["ok"] and alone["args"]["mamba_radix_cache_strategy"] == "no_buffer", alone.get("stderr")
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
    real = resolve(host_data("b200_nvlink"), "b200_nvlink").weights
    assert [w.split(":")[0] for w in unpinned(real, snapshots, "kimi_k26_dflash")] == ["moonshotai/Kimi-K2.6",
                                                                                      "z-lab/Kimi-K2.6-DFlash"]
    assert f"resolves to {commit} now" in unpinned(real, snapshots, "kimi_k26_dflash")[0]
    assert unpinned(resolve(host_data("b200_nvlink", lab=True), "b200_nvlink").weights, snapshots, "x") == []


@pytest.mark.parametrize("value, wanted", [("no", False), ("false", False), ("0", False), (False, False),
                                           ("yes", True), ("TRUE", True), ("1", True), (True, True)])
def test_boolean_knobs_read_words_as_a_user_means_them(value, wanted):
    d = resolve(host_data("b200_nvlink", install_driver=value, verify_weights=value, remove_api_key=value,
                          allow_branch_revisions=value, enable_metrics=value), "b200_nvlink")
    assert (d.host.gpu.install_driver, d.weights.verify, d.engine.service.remove_api_key, d.allow_branch_revisions,
            d.engine.service.enable_metrics) == (wanted,) * 5


def test_numbers_are_numbers_whichever_way_they_arrive():
    """`--data driver_branch=580` arrives as an int, group_data's "580" as a string: both are one branch."""
    as_int = resolve(host_data("b200_nvlink", driver_branch=580, ready_timeout_s="90", port="31500"), "b200_nvlink")
    as_str = resolve(host_data("b200_nvlink", driver_branch="580"), "b200_nvlink")
    assert as_int.host.gpu.driver_branch == as_str.host.gpu.driver_branch == "580"
    assert (as_int.engine.service.ready_timeout_s, as_int.replicas[0].port) == (90, 31500)
    assert resolve(host_data("b200_nvlink"), "b200_nvlink").host.gpu.expected.driver_min == 580


@pytest.mark.parametrize("knob, value, message", [
    ("install_driver", "maybe", "install_driver='maybe' is not a boolean: use true/false, yes/no or 1/0"),
    ("enable_metrics", "sometimes", "enable_metrics='sometimes' is not a boolean"),
    ("ready_timeout_s", "abc", "ready_timeout_s='abc' is not a whole number at least 1"),
    ("longest_generation_s", "15m", "longest_generation_s='15m' is not a whole number at least 1"),
    ("longest_generation_s", 0, "longest_generation_s=0 is not a whole number at least 1"),
    ("port", 70000, "port=70000 is not a whole number from 1 to 65535"),
    ("driver_branch", "580.1", "driver_branch='580.1' is not a whole number at least 1"),
    ("weights_dir", "models", "weights_dir='models' is not accepted: use an absolute path"),
    ("weights_dir", "/srv/../etc", "weights_dir='/srv/../etc' is not a normalized absolute path: use e.g. '/etc'"),
    ("install_dir", "/opt/spec fleet", "install_dir='/opt/spec fleet' is not accepted: use an absolute path"),
    ("service_user", "root;rm", "service_user='root;rm' is not accepted: use a user name"),
    ("service_name", "sglang\nExecStartPre=/bin/sh", "service_name='sglang\\nExecStartPre=/bin/sh' is not accepted"),
    # A lone trailing newline, which a `^...$` pattern with re.match accepts: refused all the same.
    ("service_name", "sglang\n", "service_name='sglang\\n' is not accepted"),
    ("service_user", "sglang\n", "service_user='sglang\\n' is not accepted"),
    ("hf_token_env", "HF_TOKEN\n", "hf_token_env='HF_TOKEN\\n' is not accepted"),
    ("install_dir", "/opt/specfleet\n", "install_dir='/opt/specfleet\\n' is not accepted"),
    ("hf_endpoint", "file:///etc/passwd", "hf_endpoint='file:///etc/passwd' is not accepted: use an http(s) URL"),
    ("pip_index_url", "http://x/simple' --trusted-host evil", "pip_index_url=\"http://x/simple' --trusted-host evil\""),
    ("bind_address", "everywhere", "bind_address='everywhere' is not an IP address"),
    ("hf_token_env", "HF TOKEN", "hf_token_env='HF TOKEN' is not accepted: use a variable name"),
    ("profile", "kimi_k26_dlfash",
     "profile='kimi_k26_dlfash' is no profile: did you mean 'kimi_k26_dflash'? (profiles: kimi_k26_ddtree, "
     "kimi_k26_dflash, qwen36_ar, qwen36_ddtree, qwen36_mtp; group_data/all.py and a site's)"),
    ("profile", "nosuch", "profile='nosuch' is no profile: use one of kimi_k26_ddtree, kimi_k26_dflash, "
     "qwen36_ar, qwen36_ddtree, qwen36_mtp (profiles of group_data/all.py and a site's)"),
])
def test_a_bad_knob_is_one_line_naming_the_knob_the_value_and_what_is_accepted(knob, value, message):
    with pytest.raises(BadHostData) as refused:
        resolve(host_data("b200_nvlink", **{knob: value}), "b200_nvlink")
    assert message in str(refused.value) and "\n" not in str(refused.value), str(refused.value)


def test_a_knob_refusal_is_worded_by_knobs_alone():
    """`knobs.refused` words every NAME=VALUE refusal (what is wrong, how to fix it); the product writes
    none by hand outside deployment/knobs.py."""
    assert str(knobs.refused("port", "x", "use a port")) == "port='x' is not accepted: use a port"
    assert str(knobs.refused("expected_gpus", [], "define it", wrong="is not a dict")) == \
        "expected_gpus=[] is not a dict: define it"
    by_hand = re.compile(r"BadHostData\(f?\"[^\"]*=\{")  # a message that starts NAME={value}
    # The benchmark's own knobs are worded by the change that splits serving_benchmark/sweep.py.
    product = [p for p in [*(REPO / "deployment").rglob("*.py"), *(REPO / "operations").rglob("*.py"),
                           *REPO.glob("*.py")] if p.name != "knobs.py"]
    assert [str(p.relative_to(REPO)) for p in product if by_hand.search(p.read_text())] == []


@pytest.mark.parametrize("knob, allow, url", [
    ("hf_endpoint", "allow_http_hub", "http://hub.example"),
    ("pip_index_url", "allow_http_index", "http://pypi.example/simple"),
])
def test_a_plain_http_hub_or_index_is_refused_unless_its_knob_trusts_it(knob, allow, url):
    with pytest.raises(BadHostData, match=rf"^{knob}='{url}' is not accepted: use an https:// URL, or set "
                                          rf"{allow}=true to trust plain HTTP \("):
        resolve(host_data("b200_nvlink", **{knob: url}), "b200_nvlink")
    with pytest.raises(BadHostData, match=f"{allow}='perhaps' is not a boolean"):
        resolve(host_data("b200_nvlink", **{knob: url, allow: "perhaps"}), "b200_nvlink")
    allowed = resolve(host_data("b200_nvlink", **{knob: url, allow: True}), "b200_nvlink")
    assert url in (allowed.weights.hf_endpoint, allowed.engine.service.pip_index_url)
    assert resolve(host_data("b200_nvlink", **{knob: url.replace("http:", "https:")}), "b200_nvlink")
    if knob == "pip_index_url":  # the gateway's uv reads the same index
        with pytest.raises(BadHostData, match=f"set {allow}=true"):
            gateway_config.resolve(host_data("gateway", pip_index_url=url))
        assert gateway_config.resolve(host_data("gateway", pip_index_url=url, allow_http_index=True)).pip_index_url == url


def test_profile_values_are_checked_too():
    data = host_data("b200_nvlink")
    data.profiles["kimi_k26_dflash"]["attention"] = "gqa"
    with pytest.raises(BadHostData, match=r"\['attention'\]='gqa' is not accepted: use one of mha, mla \(sglang_tuning "
                                          r"attention_backends of b200_nvlink\)"):
        resolve(data, "b200_nvlink")
    data = host_data("b200_nvlink")
    data.profiles["kimi_k26_dflash"]["target"]["revision"] = "main\nExecStartPre=/bin/sh"
    with pytest.raises(BadHostData, match="target revision"):
        resolve(data, "b200_nvlink")
    data = host_data("b200_nvlink")
    data.profiles["kimi_k26_dflash"]["sglang"]["requirement"] = "--index-url=http://evil sglang"
    with pytest.raises(BadHostData, match=r"\['sglang'\]\['requirement'\]='--index-url=http://evil sglang' is not accepted"):
        resolve(data, "b200_nvlink")
    data = host_data("b200_nvlink")
    data.profiles["kimi_k26_dflash"]["server_args"] = ["--api-key", "x y"]
    with pytest.raises(BadHostData, match=r"server_args'\]='x y' is not accepted: use single words"):
        resolve(data, "b200_nvlink")
    data = host_data("b200_nvlink")
    data.profiles["kimi_k26_dflash"]["speculative"]["num_draft_token"] = 8
    with pytest.raises(BadHostData, match=r"\['speculative'\]=.* is not accepted"):
        resolve(data, "b200_nvlink")


def test_an_unknown_or_double_class_is_one_sentence():
    with pytest.raises(BadHostData, match=r"the host is in no class group \(its groups: ct200\): put it in exactly one of the "
                                          "inventory groups b200_nvlink, b300_nvlink, h100_sxm, h200_sxm, rtx_pro_6000_pcie"):
        host_class_of(["all", "ct200"])
    with pytest.raises(BadHostData, match="in b200_nvlink and b300_nvlink class groups"):
        host_class_of(["b300_nvlink", "b200_nvlink"])


def layout_of(d) -> list[tuple]:
    return [(r.service_name, r.gpus, r.port, r.engine.tp_size) for r in d.replicas]


def test_the_class_and_profile_lay_out_the_servers_kimi_over_all_eight_qwen_one_a_gpu():
    for host_class in HOST_CLASSES:
        [kimi] = resolve_host(host_data(host_class), host_class)
        assert layout_of(kimi) == [("sglang@kimi_k26_dflash-gpu0-7", tuple(range(8)), 30000, 8)]
        assert kimi.replicas[0].gpu_env == {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7"}
        [qwen] = resolve_host(host_data(host_class, profile="qwen36_ddtree"), host_class)
        if host_class == "h100_sxm":  # a TP 1 replica's KV cache holds less than one context on 80 GB cards
            assert layout_of(qwen) == [(f"sglang@qwen36_ddtree-gpu{i}-{i + 1}", (i, i + 1), 30000 + i, 2)
                                       for i in range(0, 8, 2)]
            continue
        assert layout_of(qwen) == [(f"sglang@qwen36_ddtree-gpu{i}", (i,), 30000 + i, 1) for i in range(8)]
    # A profile a class does not lay out is one server over all of its GPUs.
    data = host_data("b200_nvlink", profile="qwen36_ddtree")
    data.layouts = {}
    assert layout_of(resolve(data, "b200_nvlink")) == [("sglang@qwen36_ddtree-gpu0-7", tuple(range(8)), 30000, 8)]


def test_each_replica_is_built_once_complete_and_frozen(monkeypatch):
    """A replica's Server is made once, from its deployment's settings and its slot of the layout: no field
    has a default to fill in later, and no pass replaces one (two deployments, one of them on 4 replicas)."""
    assert [f.name for f in dataclasses.fields(server_config.Server)
            if f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING] == []
    built = []

    @dataclasses.dataclass(frozen=True)
    class Counted(server_config.Server):
        def __post_init__(self):
            built.append((self.service_name, self.gpus, self.engine.tp_size, self.engine.model_dir))

    monkeypatch.setattr(server_config, "Server", Counted)
    found = resolve_host(host_data("rtx_pro_6000_pcie", deployments=[
        dict(profile="kimi_k26_dflash", gpus=[0, 1, 2, 3], tp_size=4),
        dict(profile="qwen36_ddtree", gpus=[4, 5, 6, 7], name="qwen")]), "rtx_pro_6000_pcie")
    assert built == [(r.service_name, r.gpus, r.engine.tp_size, r.engine.model_dir) for d in found for r in d.replicas]
    assert len(built) == 5
    with pytest.raises(dataclasses.FrozenInstanceError):
        found[0].replicas[0].gpus = ()


def test_a_replica_holds_its_unit_gpus_and_ports_and_reads_the_rest_from_its_deployment():
    """What the replicas of a deployment share is one Engine, which holds its host's ServiceHost: a replica
    holds only its unit, GPUs and ports, and nothing of a level above is copied into it or forwarded by it.
    The hub's commits move the deployment's weights directories once, on its Engine; its replicas follow."""
    assert [f.name for f in dataclasses.fields(server_config.Server)] == [
        "engine", "service_name", "gpus", "port", "nccl_port"]
    engine_names = {f.name for f in dataclasses.fields(server_config.Engine)} | {"tp_size", "venv"}
    host_names = {f.name for f in dataclasses.fields(server_config.ServiceHost)} | {"api_key_file", "hf_home"}
    assert not any(hasattr(server_config.Server, name) for name in engine_names | host_names)
    worker, (kimi, qwen) = hosts.resolve_worker(host_data("rtx_pro_6000_pcie", deployments=[
        dict(profile="kimi_k26_dflash", gpus=[0, 1, 2, 3], tp_size=4),
        dict(profile="qwen36_ddtree", gpus=[4, 5, 6, 7], name="qwen")]), "rtx_pro_6000_pcie")
    assert all(r.engine is d.engine and d.engine.service is worker.service for d in (kimi, qwen) for r in d.replicas)
    assert qwen.replicas is qwen.replicas and len(qwen.replicas) == 4  # built once
    pinned = hosts.at_commits(qwen, {"target": "c" * 40, "drafter": "d" * 40})
    assert [r.engine for r in pinned.replicas] == [pinned.engine] * 4
    assert [(r.service_name, r.gpus, r.port) for r in pinned.replicas] == [
        (r.service_name, r.gpus, r.port) for r in qwen.replicas]
    assert pinned.engine.model_dir == pinned.weights.target.local_dir and pinned.engine.model_dir.endswith("c" * 40)
    args = server_args(pinned.replicas[2])
    assert args[args.index("--model-path") + 1] == pinned.weights.target.local_dir


def test_what_is_true_of_the_host_is_one_object_its_deployments_share():
    """Users, paths, GPU runtime, smoke test and token variable are resolved once per host: each deployment
    holds the same Host, and every replica the same ServiceHost (the smoke test runs the first build)."""
    worker, (kimi, qwen) = hosts.resolve_worker(host_data("rtx_pro_6000_pcie", lab=True, deployments=[
        dict(profile="kimi_k26_dflash", gpus=[0, 1, 2, 3], tp_size=4),
        dict(profile="qwen36_ddtree", gpus=[4, 5, 6, 7], name="qwen")]), "rtx_pro_6000_pcie")
    assert kimi.host is worker and qwen.host is worker and worker.host_class == "rtx_pro_6000_pcie"
    assert all(r.engine.service is worker.service for d in (kimi, qwen) for r in d.replicas)
    assert (worker.smoke.venv, worker.smoke.build) == (kimi.engine.venv, kimi.engine.sglang_requirement)
    assert (worker.service.hf_home, worker.hf_token_env) == ("/home/sglang-download/.cache/huggingface", "HF_TOKEN")


def test_deployments_of_one_host_that_differ_in_their_environment_are_refused_in_one_line():
    """The GPU smoke test runs once per host with one environment, and its P2P decision goes into every
    unit's: a second deployment with another one is refused, not tested with the first's."""
    data = host_data("rtx_pro_6000_pcie", deployments=[
        dict(profile="kimi_k26_dflash", gpus=[0, 1, 2, 3], tp_size=4),
        dict(profile="qwen36_ddtree", gpus=[4, 5, 6, 7], name="qwen")])
    qwen = {**data.profiles["qwen36_ddtree"], "env": {"NCCL_P2P_LEVEL": "SYS"}}
    data.profiles = {**data.profiles, "qwen36_ddtree": qwen}
    with pytest.raises(BadHostData) as refused:
        resolve_host(data, "rtx_pro_6000_pcie")
    assert str(refused.value) == (
        "deployments kimi_k26_dflash and qwen run with different environments (NCCL_P2P_LEVEL, "
        "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN): the host's GPU smoke test runs once, with one; give their "
        "profiles the same env")


def test_a_host_serves_two_models_on_disjoint_gpus_each_with_its_own_units_ports_and_build():
    kimi, qwen = resolve_host(host_data("rtx_pro_6000_pcie", lab=True, deployments=[
        dict(profile="kimi_k26_dflash", gpus=[0, 1, 2, 3], tp_size=4),
        dict(profile="qwen36_ddtree", gpus=[4, 5, 6, 7], name="qwen")]), "rtx_pro_6000_pcie")
    assert layout_of(kimi) == [("sglang@kimi_k26_dflash-gpu0-3", (0, 1, 2, 3), 30000, 4)]
    assert layout_of(qwen) == [(f"sglang@qwen-gpu{i}", (i,), 30000 + i, 1) for i in (4, 5, 6, 7)]
    # Each build's virtualenv is named by its fingerprint, so another build never lands on a running one.
    assert (kimi.engine.venv, qwen.engine.venv) == tuple(
        f"/opt/specfleet/sglang-venv-{fingerprint(e.sglang_requirement, e.service.pip_index_url)}"
        for e in (kimi.engine, qwen.engine))
    assert kimi.engine.venv != qwen.engine.venv
    assert kimi.weights.target.repo_dir != qwen.weights.target.repo_dir
    # Two deployments of one build share its virtualenv; a deployment's port moves its replicas together.
    a, b = resolve_host(host_data("rtx_pro_6000_pcie", deployments=[
        dict(profile="qwen36_ddtree", gpus=[0, 1], name="a"), dict(profile="qwen36_ddtree", gpus=[2, 3], name="b",
                                                                  port=30100)]), "rtx_pro_6000_pcie")
    assert a.engine.venv == b.engine.venv and [r.port for r in b.replicas] == [30100, 30101]


@pytest.mark.parametrize("data, refusal", [
    (dict(sglang_tuning={"tp_size": 8}), "sglang_tuning['tp_size']=8 is not accepted: the TP size belongs to the "
                                         "class and the profile: set layouts['kimi_k26_dflash']['tp_size'] in "
                                         "group_data/rtx_pro_6000_pcie.py"),
    (dict(layouts={"kimi_k26_dflash": {"tp_size": 3}}), "8 GPUs do not make replicas of tp_size 3"),
    (dict(layouts={"kimi_k26_dflash": {"tp_size": 16}}), "is not a whole number from 1 to 8"),
    (dict(layouts={"kimi_k26_dflash": {"tp_size": 2, "replicas": 5}}), "['replicas']=5 does not fit 8 GPUs"),
    (dict(layouts={"kimi_k26_dflash": {"tp_size": 1, "gpus": [0, 8]}}), "from 0 to 7"),
    (dict(layouts={"kimi_k26_dflash": {"tp_size": 1, "gpus": [1, 1]}}), "name each GPU once"),
    (dict(layouts={"kimi_k26_dflash": {"tp": 8}}), "use dict(tp_size=N)"),
    (dict(deployments=[dict(profile="kimi_k26_dflash", gpus=[0, 1, 2, 3], tp_size=4),
                       dict(profile="qwen36_ddtree", gpus=[3, 4])]), "both take GPU 3"),
    (dict(deployments=[dict(profile="qwen36_ddtree", gpus=[0]), dict(profile="qwen36_ddtree", gpus=[1])]),
     "two are named 'qwen36_ddtree'"),
    (dict(deployments=[dict(profile="qwen36_ddtree", gpus=[0], name="a", port=30001),
                       dict(profile="qwen36_ddtree", gpus=[1], name="b")]),
     "sglang@a-gpu0's HTTP port and sglang@b-gpu1's HTTP port are both port 30001"),
    (dict(deployments=[dict(profile="qwen36_ddtree", gpus=[0], name="a", port=31001),
                       dict(profile="qwen36_ddtree", gpus=[1], name="b")]),
     "sglang@a-gpu0's HTTP port and sglang@b-gpu1's --nccl-port are both port 31001"),
    (dict(nccl_port=29000), "nccl_port=29000 gives a replica --nccl-port 29000, inside SGLang's random ports "
                            "22000-29999 (another server may draw it) or the kernel's ephemeral ones (32768 and "
                            "up): use a nccl_port from 30000 to 32767"),
    (dict(nccl_port=32768), "gives a replica --nccl-port 32768, inside SGLang's random ports"),
    (dict(profile="qwen36_ddtree", nccl_port=32765), "gives a replica --nccl-port 32768"),
    (dict(deployments=[dict(profile="qwen36_ddtree", gpu=[0])]), "is not accepted: use dict(profile=...)"),
    (dict(deployments=[dict(profile="qwen36_ddtree", name="a b")]), "deployment name='a b' is not accepted"),
    (dict(deployments="qwen36_ddtree"), "deployments='qwen36_ddtree' is not accepted"),
    (dict(deployments=[dict(profile="qwen36_ddtree")], node_group="kimi-tp16", node_rank=0),
     "deployments and node_group are not accepted together"),
])
def test_a_layout_that_does_not_fit_or_overlaps_the_gpus_or_ports_is_refused_in_one_line(data, refusal):
    values = host_data("rtx_pro_6000_pcie")
    for key, value in data.items():
        setattr(values, key, {**values.sglang_tuning, **value} if key == "sglang_tuning" else value)
    with pytest.raises(BadHostData) as refused:
        resolve_host(values, "rtx_pro_6000_pcie")
    assert refusal in str(refused.value) and "\n" not in str(refused.value), str(refused.value)


def test_each_replica_gets_its_own_nccl_port_apart_from_every_other_port_of_the_host():
    """Eight Qwen replicas on the PCIe class: --nccl-port 31000-31007, none an HTTP port, none in SGLang's
    random range (where it draws without the flag) or the ephemeral one; two deployments keep theirs apart."""
    replicas = resolve_host(host_data("rtx_pro_6000_pcie", profile="qwen36_ddtree"), "rtx_pro_6000_pcie")[0].replicas
    assert [r.nccl_port for r in replicas] == list(range(31000, 31008))
    assert [r.port for r in replicas] == list(range(30000, 30008))
    for r in replicas:
        argv = server_args(r)
        assert argv[argv.index("--nccl-port") + 1] == str(r.nccl_port)
        assert r.nccl_port not in range(22000, 30000) and r.nccl_port < 32768
    two = resolve_host(host_data("rtx_pro_6000_pcie", deployments=[
        dict(profile="kimi_k26_dflash", gpus=[0, 1, 2, 3], tp_size=4), dict(profile="qwen36_ddtree", gpus=[4, 5])]),
        "rtx_pro_6000_pcie")
    ports = [(r.port, r.nccl_port) for d in two for r in d.replicas]
    assert ports == [(30000, 31000), (30004, 31004), (30005, 31005)]


def test_extra_arguments_may_not_set_the_nccl_port():
    data = with_profile_args("b200_nvlink", profile_args=["--nccl-port", "25001"])
    with pytest.raises(BadHostData) as refused:
        resolve(data, "b200_nvlink")
    assert "--nccl-port" in str(refused.value) and "nccl_port" in str(refused.value)


def with_profile_args(host_class: str, class_args: list[str] = (), profile_args: list[str] | None = None):
    data = host_data(host_class)
    data.sglang_tuning = {**data.sglang_tuning, "extra_args": [*data.sglang_tuning["extra_args"], *class_args]}
    if profile_args is not None:
        data.profiles["kimi_k26_dflash"]["server_args"] = profile_args
    return data


def test_extra_arguments_may_not_repeat_a_flag_the_deploy_sets():
    kimi = server_args(resolve(host_data("b200_nvlink"), "b200_nvlink").replicas[0])
    # What an extra --host does to the rendered line: argparse takes the last, so it wins over
    # bind_address (loopback here, which preflight's exposure check saw), also abbreviated or with =.
    extra = [["--host", "0.0.0.0"], ["--host=0.0.0.0"], ["--ho", "0.0.0.0"]]
    for result in parse_many_with_real_sglang([kimi + words for words in extra]):
        assert result["ok"] and result["args"]["host"] == "0.0.0.0"
    for words in (*extra, ["--port", "8080"], ["--api-key", "k" * 16], ["--model", "/tmp/m"],
                  ["--speculative-draft-model-path=/tmp/d"], ["--tensor-parallel-size", "1"], ["--enable-metrics"]):
        with pytest.raises(BadHostData) as refused:
            resolve(with_profile_args("b200_nvlink", class_args=words), "b200_nvlink")
        assert str(refused.value).startswith("sglang_tuning extra_args=") and "which the deploy sets itself" in \
            str(refused.value) and "\n" not in str(refused.value), str(refused.value)
        with pytest.raises(BadHostData, match=r"profiles\['kimi_k26_dflash'\]\['server_args'\]="):
            resolve(with_profile_args("b200_nvlink", profile_args=["--trust-remote-code", *words]), "b200_nvlink")
    with pytest.raises(BadHostData, match=r"use bind_address for --host, which the deploy sets itself \(--ho would"):
        resolve(with_profile_args("b200_nvlink", class_args=["--ho", "0.0.0.0"]), "b200_nvlink")


def test_the_deploys_own_flags_cover_what_it_renders_and_refuse_no_other_sglang_flag():
    from deployment.server.config import DEPLOY_FLAGS, deploy_flags
    from tests.unit.test_nodes import resolved, two_nodes
    for host_class in HOST_CLASSES:
        for profile in ("kimi_k26_dflash", "qwen36_ddtree"):
            server = resolve(host_data(host_class, profile=profile, enable_metrics=True), host_class).replicas[0]
            rendered = {arg for arg in server_args(server) if arg.startswith("--")} - set(server.engine.extra_args)
            # A layout's context (a class whose KV cache holds less than the model's) is the deploy's flag there.
            assert rendered - set(deploy_flags(server.engine.layout, profile)) == set(), (host_class, profile)
    inventory = two_nodes()  # a node group's part: --nnodes, --node-rank, --dist-init-addr
    group = resolved(inventory, inventory[1]).replicas[0]
    assert {arg for arg in group.engine.node_args if arg.startswith("--")} - set(DEPLOY_FLAGS) == set()
    # The real 0.5.23 parser's options (lab/sglang_standin/sglang/flags_0_5_23.json, extracted from
    # it): none outside the deploy's (a layout's context included) is refused as an abbreviation of one of them.
    owned = {*DEPLOY_FLAGS, "--context-length"}
    table = json.loads((REPO / "lab/sglang_standin/sglang/flags_0_5_23.json").read_text())["actions"]
    others = {flag for action in table for flag in action["option_strings"] if flag.startswith("--")} - owned
    assert not [flag for flag in others if any(flag_owned.startswith(flag) for flag_owned in owned)]
    # The class and profile arguments the product ships pass.
    for host_class in HOST_CLASSES:
        resolve(host_data(host_class, profile="qwen36_ddtree"), host_class)


@pytest.mark.parametrize("knob", ["service_user", "gateway_user"])
def test_root_is_never_the_service_user(knob):
    from deployment.gateway.config import resolve as resolve_gateway
    with pytest.raises(BadHostData) as refused:
        if knob == "service_user":
            resolve(host_data("b200_nvlink", service_user="root"), "b200_nvlink")
        else:
            resolve_gateway(host_data("gateway", gateway_user="root"))
    assert str(refused.value) == (f"{knob}='root' is not accepted: use a user of the service's own, not root (the "
                                  "deploy creates it as a system user without a login shell)")


@pytest.mark.parametrize("knob, value", [
    ("pip_index_url", "https://deploy:s3cret@pypi.example/simple/"),
    ("pip_index_url", "https://tok3n@pypi.example/simple/"),
    ("hf_endpoint", "https://user:hf_s3cret@hub.example"),
    ("nvidia_repo_url", "https://u:s3cret@mirror.example/cuda/repos"),
])
def test_credentials_in_a_url_are_refused_and_never_shown(knob, value):
    with pytest.raises(BadHostData) as refused:
        resolve(host_data("b200_nvlink", **{knob: value}), "b200_nvlink")
    message = str(refused.value)
    assert message.startswith(f"{knob}='https://***@") and "without user:password@" in message and "~/.netrc" in message
    assert "s3cret" not in message and "tok3n" not in message


def test_credentials_in_a_requirement_url_are_refused_and_never_shown():
    data = host_data("b200_nvlink")
    data.mirrors = {"repos": {}, "requirements": {
        "sglang==0.5.23": "sglang @ https://ci:s3cret@wheels.example/sglang-0.5.23-py3-none-any.whl"}}
    with pytest.raises(BadHostData) as refused:
        resolve(data, "b200_nvlink")
    assert "sglang @ https://***@wheels.example/" in str(refused.value) and "s3cret" not in str(refused.value)
    data = host_data("b200_nvlink", profile="qwen36_ddtree")
    data.profiles["qwen36_ddtree"]["sglang"]["requirement"] = \
        "sglang @ git+https://ghp_t0ken@github.com/sgl-project/sglang@" + "a" * 40 + "#subdirectory=python"
    with pytest.raises(BadHostData, match=r"git\+https://\*\*\*@github.com"):
        resolve(data, "b200_nvlink")
    # A user name in an SSH URL is no secret.
    ssh = "sglang @ git+ssh://git@github.com/sgl-project/sglang@" + "a" * 40 + "#subdirectory=python"
    data.profiles["qwen36_ddtree"]["sglang"]["requirement"] = ssh
    assert resolve(data, "b200_nvlink").engine.sglang_requirement == ssh


def test_a_profile_name_is_checked_before_it_reaches_the_unit_file():
    data = host_data("b200_nvlink", profile="kimi\nExecStartPre=/bin/sh -c id")
    data.profiles = {**data.profiles, data.profile: data.profiles["kimi_k26_dflash"]}
    with pytest.raises(BadHostData) as refused:
        resolve(data, "b200_nvlink")
    assert str(refused.value).startswith("profile='kimi\\nExecStartPre=/bin/sh -c id' is not accepted: use a "
                                         "profile name")


def test_a_percent_reaches_the_weights_unit_as_written_not_as_a_systemd_specifier():
    """systemd reads `%x` in a unit as a specifier: a %-encoded mirror URL is written with `%%`, which
    systemd turns back into `%` (an unescaped `%2F` dropped the line, and the fetcher went to the public hub)."""
    w = resolve(host_data("b200_nvlink", hf_endpoint="https://mirror.example/hf%2Fproxy"), "b200_nvlink").weights
    text = render("weights/weights.service.j2", w=w, repo=w.target, commit="a" * 40, spec_file="/etc/specfleet/s.json")
    assert "Environment=HF_ENDPOINT=https://mirror.example/hf%%2Fproxy\n" in text


def test_a_server_on_loopback_keeps_nccl_and_gloo_listening_on_loopback():
    """NCCL's bootstrap and Gloo's device listen on an interface of their own choosing: `lo` for a server
    alone on loopback, theirs for an exposed one (which a key guards), a site's own setting kept."""
    loopback = resolve(host_data("b200_nvlink"), "b200_nvlink").replicas[0]
    exposed = resolve(host_data("b200_nvlink", bind_address="0.0.0.0"), "b200_nvlink").replicas[0]
    site = resolve(host_data("b200_nvlink", sglang_tuning={**host_data("b200_nvlink").sglang_tuning,
                                                           "env": {"NCCL_SOCKET_IFNAME": "eth0"}}), "b200_nvlink")
    assert (loopback.engine.env["NCCL_SOCKET_IFNAME"], loopback.engine.env["GLOO_SOCKET_IFNAME"]) == ("lo", "lo")
    assert "NCCL_SOCKET_IFNAME" not in exposed.engine.env and "GLOO_SOCKET_IFNAME" not in exposed.engine.env
    assert site.engine.env["NCCL_SOCKET_IFNAME"] == "eth0"
    assert "NCCL_SOCKET_IFNAME=lo\n" in unit_files(loopback, "", ())[1]
