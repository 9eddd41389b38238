"""SGLang 0.5.23's own startup decides: every shipped profile on every class's layout, and every candidate the
tuner would try of it, runs through the wheel's startup arithmetic (tests/sglang_startup_real.py: the server
arguments and their post-init, the model configs, the context length, the KV cells, the mamba ratio and state
slots, resolve_max_num_reqs, the pool for the free memory planned, max_req_len), with the models' config.json
(tests/fixtures/model_configs) and the class's GPU. An assertion or refusal there fails; the planner
(deployment/server/capacity.py plan_server) is held to the engine's figures.

The engine is given the free memory the plan says it will read, before and after the load, so what is compared
is the arithmetic from there on: tokens, max running requests and the longest request must be the engine's,
but for the tokens' last page. The plan reads the page size from the rendered flags; resolution raises it where
a backend pages (trtllm_mla: 64), and the engine floors its tokens to that page, so they may differ by less
than one of its pages. What the plan cannot get from the wheel is what a real host holds before the load
(resident.resident_before_load): that is held to a real engine by tests/deployed, not here.

DDTree is in no release: its command lines run as the release it builds on sees them (DFLASH drafting;
resolution_cases.as_released), the figures of the pull request's own code are not checked here.
"""

import copy
import json
from dataclasses import replace
from pathlib import Path

import pytest

from deployment import site_data
from deployment.hosts import resolve
from deployment.server import capacity
from deployment.server.command_line import server_args
from tests.sglang_startup import model_folder, startup_with_real_sglang
from tests.unit.group_data import host_data
from tests.unit.resolution_cases import as_released, class_gpu
from tests.unit.test_capacity import config, drafter_config
from tuning.candidates import candidates

MIB = 1 << 20
HOST_CLASSES = site_data.host_classes()  # the product's, as the suite runs without a site
# The models' weights in bytes, as the README gives them (the drafter's split of Qwen's 54 GB is not published;
# it moves both figures alike): target, drafter.
WEIGHTS = {"moonshotai/Kimi-K2.6": (595 * 10**9, 6 * 10**9), "Qwen/Qwen3.6-27B": (52 * 10**9, 2 * 10**9)}
# How the engine stops for want of memory (kv_cache_configurator.py _profile_available_bytes, _handle_max_mamba_cache,
# resolve_max_num_reqs).
MEMORY_STOPS = ("ValueError: Loaded weights leave no GPU memory for the KV cache",
                "RuntimeError: Not enough GPU memory for hybrid", "RuntimeError: Hybrid (mamba/linear-attention) state "
                "cache is too small")
CONFIGS = {"moonshotai/Kimi-K2.6": "Kimi-K2.6", "Qwen/Qwen3.6-27B": "Qwen3.6-27B"}


def shipped_replicas(data_of=host_data) -> dict[str, object]:
    """Each class x profile's replica as the class lays it out, and each candidate the tuner would try of it."""
    found = {}
    for host_class in HOST_CLASSES:
        for profile in data_of(host_class).profiles:
            data = data_of(host_class, profile=profile)
            found[f"{host_class}-{profile}"] = resolve(data, host_class).replicas[0]
            tried, _ = candidates(data, host_class, profile)
            for candidate in tried:
                found.setdefault(f"{host_class}-{profile}-{candidate.label}", candidate.deployment.replicas[0])
    return found


def case_of(replica, store: Path, data_of=host_data) -> tuple[dict, capacity.CapacityPlan]:
    """The replica's case for the engine, its models' configs at folders of `store`, and the plan the product
    makes of the same replica on the class's GPU."""
    e = replica.engine
    profile = data_of(e.host_class).profiles[e.profile_name]
    repo = profile["target"]["repo"]
    target, drafter_weights = WEIGHTS[repo]
    drafter = e.speculative.entry.drafter
    replica = replace(replica, engine=replace(
        e, model_dir=model_folder(store, CONFIGS[repo], config(CONFIGS[repo])),
        draft_model_dir=model_folder(store, "drafter", drafter_config())))
    gpu = class_gpu(e.host_class)
    args = server_args(replica)
    plan = capacity.plan_server(replica.service_name, args, card_bytes=gpu["memory_mib"] * MIB,
                                target_config=config(CONFIGS[repo]), target_weight_bytes=target,
                                drafter_config=drafter_config() if drafter else None,
                                drafter_weight_bytes=drafter_weights if drafter else 0,
                                draft_kv_of_target=e.speculative.entry.draft_kv_of_target)
    case = {"argv": as_released(args), "env": dict(e.env), "gpu": gpu,
            "pre_gib": plan.free_before_load_bytes / capacity.GIB,
            "loaded_gib": plan.free_after_load_bytes / capacity.GIB}
    return case, plan


REPLICAS = shipped_replicas()
SHIPPED = [f"{host_class}-{profile}" for host_class in HOST_CLASSES for profile in host_data(host_class).profiles]


@pytest.fixture(scope="module")
def started(tmp_path_factory) -> dict[str, tuple[dict, capacity.CapacityPlan]]:
    """The engine's answer and the plan per replica, in one run of the real env (~1-2 min on 2 cores)."""
    store = tmp_path_factory.mktemp("models")
    planned = {name: case_of(replica, store) for name, replica in REPLICAS.items()}
    # The engine's answer depends on the case alone: candidates that render alike (DDTree's budgets, as released)
    # run once.
    unique = {json.dumps(case, sort_keys=True): case for case, _ in planned.values()}
    answers = dict(zip(unique, startup_with_real_sglang(list(unique.values()))))
    return {name: (answers[json.dumps(case, sort_keys=True)], plan) for name, (case, plan) in planned.items()}


@pytest.mark.parametrize("name", SHIPPED)
def test_the_engine_starts_every_shipped_profile_on_every_class(started, name):
    """Where the class's cards cannot hold the weights and a pool (Kimi K2.6 at TP 8 on 80 GB cards, whose class
    says so), the engine stops for want of memory and preflight refuses the layout before any restart."""
    engine, plan = started[name]
    if engine.get("error", "").startswith(MEMORY_STOPS[0]):
        assert capacity.refusal(plan, min_tokens=1) is not None, (name, plan)
        return
    assert "error" not in engine, f"SGLang 0.5.23's startup stops {name}: {engine['error']}"
    assert plan.engine_refusal is None, plan.engine_refusal


@pytest.mark.parametrize("name", list(REPLICAS))
def test_the_plan_is_the_engines_startup(started, name):
    """Where the engine starts, the plan holds its tokens, running requests and longest request; where it stops for
    want of memory, the plan holds no tokens (preflight refuses it below min_kv_tokens); where it stops on an
    assertion, the plan quotes it."""
    engine, plan = started[name]
    if "error" in engine:
        if engine["error"].startswith("AssertionError"):
            assert plan.engine_refusal == engine["error"], (engine["error"], plan.engine_refusal)
        else:
            assert engine["error"].startswith(MEMORY_STOPS) and plan.tokens == 0, (engine["error"], plan)
        return
    assert plan.engine_refusal is None, (plan.engine_refusal, engine)
    page = engine["resolved"]["page_size"]
    assert 0 <= plan.tokens - engine["max_total_num_tokens"] < page, (plan.tokens, engine)
    assert plan.max_running_requests == engine["max_running_requests"], (plan, engine)
    assert plan.max_request_tokens == engine["max_req_len"], (plan, engine)


def test_the_lazy_extra_buffer_without_the_overlap_schedule_is_refused_by_both_in_the_engines_words(tmp_path):
    """The combination SGLang accepts in its arguments and asserts on once the weights are in: the engine's own
    assertion, and the planner's refusal (what preflight prints) quoting it."""
    profiles = copy.deepcopy(host_data("rtx_pro_6000_pcie").profiles)
    own = profiles["qwen36_ddtree"]["server_args"]
    own[own.index("--mamba-radix-cache-strategy") + 1] = "extra_buffer_lazy"
    data = host_data("rtx_pro_6000_pcie", profile="qwen36_ddtree", profiles=profiles)
    replica = resolve(data, "rtx_pro_6000_pcie").replicas[0]
    case, plan = case_of(replica, tmp_path, lambda c, **kw: host_data(c, **{"profiles": profiles, **kw}))
    (engine,) = startup_with_real_sglang([case])
    words = "Lazy extra buffer requires overlap schedule (--disable-overlap-schedule is incompatible)"
    assert engine == {"error": f"AssertionError: {words}"}
    assert capacity.refusal(plan, min_tokens=1) == (
        f"{replica.service_name}: SGLang 0.5.23 would stop sizing its memory pool, after loading the weights: "
        f"AssertionError: {words}")
