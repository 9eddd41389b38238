"""The tuner's search (tuning/search.py) on the figures the lab's stand-in engine would give (its speed model,
lab/sglang_standin/sglang/speed_model.py: modelled, not measured) for Qwen3.6-27B's candidates on the 8-card
PCIe class, as tuning/candidates.py lays them out, with P2P off (NCCL_P2P_DISABLE=1: the all-reduce through
host memory): the walk finds the full grid's best within 5 % on the objective in at most 40 % of its trials,
and with several requests the best is what the seed's box found: one GPU a replica, a chain (spine mode),
fewer verified tokens as the batch grows."""

import json
import math

import pytest

from lab.gpu_standin.build_profiles import PROFILES_DIR
from lab.repos import QWEN_CONFIG
from lab.sglang_standin.sglang import speed_model
from deployment import hosts
from deployment.server.command_line import server_args
from tests.unit.group_data import host_data
from tuning import report
from tuning.candidates import candidates
from tuning.search import Figures, Trial, objective, search

PCIE = "rtx_pro_6000_pcie"
PROFILE = "qwen36_ddtree"
QWEN = speed_model.target(QWEN_CONFIG)  # the lab hub's Qwen3.6 config: hybrid, 3 linear-attention layers in 4
# The PCIe box's all-reduce with P2P off: its GPU profile's host-memory bus bandwidth (a real capture).
NO_P2P = json.loads((PROFILES_DIR / PCIE / "profile.json").read_text())["allreduce"]["no_p2p"]["busbw_gbps"]
LINK = speed_model.Link("host", max(NO_P2P.values(), key=float))


def qwen_candidates(algorithms=("dflash", "ddtree"), **data):
    data = host_data(PCIE, profile=PROFILE, **data)
    found, _ = candidates(data, PCIE, PROFILE, algorithms=algorithms)
    _, (deployed,) = hosts.resolve_worker(data, PCIE)
    anchor = next(c for c in found if c.deployment.engine.speculative == deployed.engine.speculative
                  and c.shape == (deployed.engine.tp_size, len(deployed.replicas)))  # as tune.py anchors it
    return found, anchor


def settings(candidate) -> tuple:
    """What the stand-in's speed model reads of the candidate's command line: SGLang's algorithm (None: AR), its
    draft tokens, DDTree's budget, the EAGLE family's steps and top-k."""
    args = server_args(candidate.deployment.replicas[0])

    def flag(name):
        return int(args[args.index(name) + 1]) if name in args else None
    algorithm = args[args.index("--speculative-algorithm") + 1] if "--speculative-algorithm" in args else None
    return (algorithm, flag("--speculative-num-draft-tokens"), flag("--speculative-ddtree-budget"),
            flag("--speculative-num-steps"), flag("--speculative-eagle-topk"))


def modelled(candidate, levels: tuple[int, ...]) -> Trial:
    """The candidate's levels as the stand-in's scheduler paces them: the `c` requests spread over its replicas,
    each replica's batch advancing by the accept length a step."""
    algorithm, n, budget, steps, topk = settings(candidate)
    tp, replicas = candidate.shape
    pace, accept = speed_model.server(QWEN, algorithm, n, budget, tp, LINK, steps, topk)
    found = {}
    for c in levels:
        step = pace.step_seconds(math.ceil(c / replicas))
        found[c] = Figures(c, throughput=c * accept / step, ttft_ms=speed_model.PREFILL_S * 1000,
                           tpot_ms=step / accept * 1000, accept_length=accept)
    return Trial(found)


def picks(name: str, levels: tuple[int, ...], **compared):
    points, anchor = qwen_candidates(**compared)
    table = {id(p): modelled(p, levels) for p in points}
    goal = objective(name, levels)
    full = search(points, lambda p, bar: table[id(p)], goal, how="grid")
    walk = search(points, lambda p, bar: table[id(p)], goal, anchor=anchor)
    return goal, full, walk


@pytest.mark.parametrize(("name", "levels"), [("throughput", (1,)), ("throughput", (1, 8)), ("throughput", (1, 32)),
                                              ("throughput", (1, 64)), ("latency", (1, 8))])
def test_the_walk_finds_the_grids_best_on_the_speed_model_in_at_most_40_percent_of_its_trials(name, levels):
    goal, full, walk = picks(name, levels)
    best, mine = goal.value(full.winner[1]), goal.value(walk.winner[1])
    print(f"{name} at concurrency {goal.concurrency}: grid {len(full.trials)} trials, pick {full.winner[0].label} "
          f"({best:.0f}); walk {len(walk.trials)} trials, pick {walk.winner[0].label} ({mine:.0f})")
    assert len(full.trials) == full.grid == 45
    assert mine >= 0.95 * best and len(walk.trials) <= 0.40 * len(full.trials)


@pytest.mark.parametrize("concurrency", [8, 32, 64])
def test_with_several_requests_qwen_lands_on_one_gpu_a_replica_verifying_a_chain(concurrency):
    goal, full, walk = picks("throughput", (1, concurrency))
    for point, _ in (full.winner, walk.winner):
        assert point.shape == (1, 8) and point.kind[-1] is False  # TP1 replicas, no tree
    trees = [goal.value(t) for p, t in full.trials if p.kind[-1] and p.shape == (1, 8)]
    assert trees and max(trees) < 0.95 * goal.value(full.winner[1])  # larger budgets lose on the hybrid model


def test_one_request_on_one_gpu_is_about_the_seeds_6_5_times_autoregressive_decoding():
    _, full, _ = picks("latency", (1,))
    spine = next(t for p, t in full.trials if settings(p)[:3] == ("DDTREE", 16, 15) and p.shape == (1, 8))
    assert 5.5 < full.speedup(spine) < 7.5


def test_at_high_concurrency_the_pick_verifies_fewer_draft_tokens_than_at_concurrency_1():
    verified = {}
    for levels in ((1,), (1, 32), (1, 64)):
        goal, _, walk = picks("throughput", levels)
        verified[goal.concurrency] = speed_model.width(*settings(walk.winner[0])[:3])
    print(f"verified tokens a step of the pick, by concurrency: {verified}")
    assert verified[64] < verified[1] and verified[64] <= verified[32] <= verified[1]


# A profile of the model that drafts nothing, and one naming DFlash on the release build: what the tuner compares
# beside the deployed qwen36_ddtree (with the shipped profiles of the model, whatever algorithms they add).
PLAIN = {"target": {"repo": "Qwen/Qwen3.6-27B", "revision": "main"}, "attention": "mha",
         "served_model_name": "qwen3.6-27b", "server_args": ["--trust-remote-code"],
         "sglang": {"requirement": "sglang==0.5.23", "version": "0.5.23"}}
DFLASH = {**PLAIN, "drafter": {"repo": "z-lab/Qwen3.6-27B-DFlash", "revision": "main"},
          "env": {"SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN": "1"},
          "speculative": {"algorithm": "DFLASH", "num_draft_tokens": 16}}
ACROSS = {"algorithms": None,
          "profiles": {**host_data(PCIE).profiles, "qwen36_plain": PLAIN, "qwen36_dflash": DFLASH}}


@pytest.mark.parametrize(("name", "levels"), [("throughput", (1,)), ("throughput", (1, 8)), ("throughput", (1, 64)),
                                              ("latency", (1, 8))])
def test_across_the_models_profiles_and_algorithms_the_walk_finds_the_grids_best_in_at_most_40_percent(name, levels):
    goal, full, walk = picks(name, levels, **ACROSS)
    best, mine = goal.value(full.winner[1]), goal.value(walk.winner[1])
    kinds = {p.kind[:2] for p, _ in full.trials if not p.baseline}
    print(f"{name} at concurrency {goal.concurrency}: {sorted(kinds)}; grid {len(full.trials)} trials, pick "
          f"{full.winner[0].label} ({best:.0f}); walk {len(walk.trials)} trials, pick {walk.winner[0].label} ({mine:.0f})")
    assert {"qwen36_ddtree", "qwen36_dflash"} <= {profile for profile, _ in kinds}
    assert "speculative" not in ACROSS["profiles"][full.baseline[0].settings["profile"]]  # AR's own profile
    assert mine >= 0.95 * best and len(walk.trials) <= 0.40 * len(full.trials)


def test_the_report_names_each_levels_winner_and_each_algorithms_best_with_its_speedup_over_ar():
    goal, full, _ = picks("throughput", (1, 64), **ACROSS)
    labels = [p.label for p, _ in full.trials]
    compared = report.compared(full)
    assert sorted(compared) == [1, 64]
    for c, rows in compared.items():
        assert rows[0]["algorithm"] == max(rows, key=lambda r: r["throughput"])["algorithm"]  # the winner first
        ar = next(r for r in rows if r["algorithm"] == "AR")
        assert ar["speedup"] == pytest.approx(1.0) and ar["accept_length"] == 1.0
        # Each algorithm's best over the baseline measured in the same run, at that level.
        base = full.baseline[1].levels[c].throughput
        assert all(r["speedup"] == pytest.approx(r["throughput"] / base) for r in rows)
    assert compared[1][0]["speedup"] > 5 and compared[1][0]["accept_length"] > 5  # a 16-token chain, one request
    text = report.comparison(full, labels)
    assert text.splitlines()[0].startswith(f"concurrency 1: {compared[1][0]['algorithm']} wins (")
    assert f"| AR | #1 {labels[0]} | " in text and labels[0].startswith("AR TP1x8 (qwen36_") and "| 1.00x | 1.00 |" in text
