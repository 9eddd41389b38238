"""The tuner's search (tuning/search.py), pure: on tables shaped as this project's measurements are (Qwen3.6-27B
on the 8-card PCIe box: DDTree at budget 15 about 6.5x autoregressive decoding on one GPU, larger budgets
worse, the lead narrowing as the batch grows and under the PCIe all-reduce), the walk picks what the full grid
picks, within 5 % on the objective, measuring at most 40 % of the grid's trials."""

import math
import random
from dataclasses import dataclass

import pytest

from tuning.search import EARLY_STOP, Figures, Trial, behind, objective, search

LAYOUTS = ((1, 8), (2, 4), (4, 2), (8, 1))  # TP size x replicas of 8 cards
# (algorithm, tree?) -> the values on its axis, as tuning/candidates.py lays out Qwen3.6's (block 16)
AXES = {("DFLASH", False): [(n, 0) for n in (4, 8, 12, 16)],
        ("DDTREE", False): [(16, b) for b in (3, 7, 11, 15)],
        ("DDTREE", True): [(16, b) for b in (31, 63, 127)]}


@dataclass(frozen=True)
class Point:
    kind: tuple
    shape: tuple
    axis: tuple
    baseline: bool = False


ANCHOR = Point(("DDTREE", False), LAYOUTS[0], (16, 15))  # the profile's: budget 15 on one GPU a replica


def grid() -> list[Point]:
    return [Point(("AR", False), LAYOUTS[0], (0, 0), baseline=True),
            *(Point(kind, shape, axis) for shape in LAYOUTS for kind, axes in AXES.items() for axis in axes)]


def figures(point: Point, concurrency: int) -> Figures:
    """One level of a Qwen3.6-27B trial on the PCIe class. Per step of a replica: the weights' read (30 ms at
    TP 1, split by TP), each verified token's compute (0.6 ms, split by TP), the drafter's pass, and at TP > 1
    the all-reduce over PCIe (2 ms a step and 0.05 ms a token); a chain of L draft tokens is accepted at
    0.9 a token (1 + 0.9 + ... + 0.9^L with the bonus token: 8.2 at L = 15); a tree gains little over its
    spine and loses on the hybrid model's recurrent state (x0.85)."""
    tp, replicas = point.shape
    batch = math.ceil(concurrency / replicas)
    algorithm, tree = point.kind
    n, budget = point.axis
    if point.baseline:
        verified, accepted, draft_ms = 1, 1.0, 0.0
    else:
        chain = n - 1 if algorithm == "DFLASH" else min(budget, n - 1)
        accepted = 1 + sum(0.9 ** i for i in range(1, chain + 1))
        verified = (n if algorithm == "DFLASH" else budget + 1)
        if tree:
            accepted *= (1 + 0.08 * math.log2(budget / 15)) * 0.85
        draft_ms = 3 + 0.05 * n * batch
    tokens = batch * verified
    step_ms = 30 / tp + tokens * 0.6 / tp + draft_ms + (2 + 0.05 * tokens if tp > 1 else 0)
    per_request = accepted / step_ms * 1000
    return Figures(concurrency, throughput=per_request * batch * replicas, ttft_ms=80 * tp ** -0.5 + 5 * batch,
                   tpot_ms=1000 / per_request, accept_length=accepted, power_w=600.0 * 8)


def measured(noise: float, seed: int):
    """The table as measured: each figure off the model's by up to `noise` (a run's variation)."""
    rng = random.Random(seed)
    table = {}
    for point in grid():
        jitter = {c: 1 + rng.uniform(-noise, noise) for c in (1, 8, 64)}
        table[point] = Trial({c: Figures(c, f.throughput * jitter[c], f.ttft_ms, f.tpot_ms / jitter[c],
                                         f.accept_length, f.power_w)
                              for c in (1, 8, 64) for f in [figures(point, c)]})
    return table


def measure_from(table, stopped: list):
    def measure(point, bar):
        trial = table[point]
        value = goal_of[0].value(trial)
        if bar is not None and value < bar:
            stopped.append(point)
            return Trial(trial.levels, stopped=True)
        return trial
    return measure


goal_of: list = []


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize(("name", "levels"), [("throughput", (1, 8)), ("throughput", (1, 64)),
                                              ("latency", (1, 8)), ("energy", (1, 64))])
def test_the_walk_picks_the_grids_best_within_5_percent_running_at_most_40_percent_of_its_trials(name, levels, seed):
    table = measured(0.02, seed)
    goal = objective(name, levels)
    goal_of[:] = [goal]
    full = search(grid(), measure_from(table, []), goal, how="grid")
    stopped = []
    walk = search(grid(), measure_from(table, stopped), goal, anchor=ANCHOR)
    best, mine = goal.value(full.winner[1]), goal.value(walk.winner[1])
    print(f"{name} at {goal.concurrency}: grid {len(full.trials)} trials, walk {len(walk.trials)} "
          f"({len(stopped)} stopped early); best {best:.1f} ({full.winner[0].kind} {full.winner[0].axis} "
          f"TP{full.winner[0].shape[0]}), walk's {mine:.1f}")
    assert len(full.trials) == len(grid()) == 45 and not any(t.stopped for _, t in full.trials)
    assert mine >= 0.95 * best
    assert len(walk.trials) <= 0.40 * len(full.trials)


def test_on_one_gpu_a_replica_the_16_token_chain_wins_and_larger_tree_budgets_lose():
    """The seed's box measured one GPU a replica: there the 16-token chain (DDTree's spine at budget 15, which
    DFlash's 16-token block verifies alike) is best for one request, several times autoregressive decoding,
    and every tree budget above it loses, the larger the more."""
    table = measured(0.0, 0)
    goal = objective("latency", (1, 8))
    goal_of[:] = [goal]
    one_gpu = [p for p in grid() if p.shape == (1, 8)]
    result = search(one_gpu, measure_from(table, []), goal, anchor=ANCHOR)
    point, trial = result.winner
    assert (point.kind, point.axis) in ((("DDTREE", False), (16, 15)), (("DFLASH", False), (16, 0)))
    assert 5.5 < result.speedup(trial) < 7.0
    trees = [goal.value(table[p]) for p in one_gpu if p.kind == ("DDTREE", True)]
    assert max(trees) < goal.value(trial) and trees == sorted(trees, reverse=True)


def test_at_high_concurrency_fewer_draft_tokens_win_than_at_concurrency_1():
    table = measured(0.0, 0)
    picks = {}
    for levels in ((1,), (1, 64)):
        goal = objective("throughput", levels)
        goal_of[:] = [goal]
        picks[goal.concurrency] = search(grid(), measure_from(table, []), goal, anchor=ANCHOR).winner[0]
    verified = {c: (p.axis[1] + 1 if p.kind[0] == "DDTREE" else p.axis[0]) for c, p in picks.items()}
    assert verified[64] < verified[1]


def test_a_winner_meets_the_limits_and_a_candidate_that_breaks_them_cannot_win():
    table = measured(0.0, 0)
    free = objective("throughput", (1, 64))
    goal_of[:] = [free]
    unlimited = search(grid(), measure_from(table, []), free, how="grid").winner[1]
    limit = unlimited.levels[64].ttft_ms - 1  # the unlimited winner breaks it
    goal = objective("throughput", (1, 64), max_ttft_ms=limit)
    goal_of[:] = [goal]
    picks = []
    for how in ("grid", "walk"):
        _, trial = search(grid(), measure_from(table, []), goal, how=how, anchor=ANCHOR).winner
        assert trial.levels[64].ttft_ms <= limit
        picks.append(goal.value(trial))
    assert picks[1] >= 0.95 * picks[0]
    impossible = objective("throughput", (1, 64), max_ttft_ms=1.0)
    goal_of[:] = [impossible]
    assert search(grid(), measure_from(table, []), impossible, anchor=ANCHOR).winner is None


def test_a_trial_told_a_bar_stops_once_clearly_behind_and_never_leads():
    assert not behind(10.0, None, 100)  # no leader yet: it runs to its end
    assert not behind(10.0, 50.0, 3)  # too few requests to judge
    assert behind(10.0, 50.0, 8) and not behind(60.0, 50.0, 8)
    table = measured(0.0, 0)
    goal = objective("throughput", (1, 8))
    goal_of[:] = [goal]
    bars = []
    result = search(grid(), lambda p, bar: (bars.append(bar), table[p])[1], goal, anchor=ANCHOR)
    assert bars[0] is None and all(b is not None for b in bars[2:])
    leader_value = goal.value(result.winner[1])
    assert max(b for b in bars if b) <= leader_value * (1 - EARLY_STOP) + 1e-9
    stopped = Trial(table[result.winner[0]].levels, stopped=True)
    assert not goal.meets(stopped)


def test_an_objective_it_cannot_read_is_refused_in_one_line():
    with pytest.raises(ValueError, match=r"^objective=latency reads one request's speed at concurrency 1"):
        objective("latency", (8, 32))
    with pytest.raises(ValueError, match=r"^objective='speed' is not accepted: use one of throughput, latency"):
        objective("speed", (1,))
    with pytest.raises(ValueError, match=r"^search='random' is not accepted"):
        search(grid(), lambda p, bar: Trial({}), objective("throughput", (1,)), how="random")
    no_power = Trial({1: Figures(1, 100.0, 50.0, 10.0)})
    assert objective("energy", (1,)).value(no_power) is None
