"""The search for the best candidate (tuning/candidates.py), pure: measure the fewest trials that find it.

Each trial serves one candidate and measures it at every concurrency asked (`Figures` a level). The
objective reads one level of it: `throughput` (output tokens/s of the host) and `energy` (output tokens per
joule of its GPUs, where their power draw can be read) at the highest level asked, `latency` (one request's
decode speed, 1000 / TPOT) at concurrency 1. A winner must meet the limits (`max_tpot_ms`, `max_ttft_ms`)
at that level.

`search="grid"` measures every candidate. The default search walks the table's axes, which the measurements
this project started from say are each unimodal (the Qwen3.6 sweeps: accept length rising with draft length
and budget with diminishing returns while the verify's cost rises with them, so one best budget, 15 there):

1. the baseline (autoregressive decoding, at the layout deployed), which every speedup is over;
2. coarse: the setting deployed (the anchor) at every layout, and at the best of them each other algorithm
   and mode (spine, tree), those of the model's other profiles among them, at its setting nearest the
   anchor's;
3. refine: from each algorithm within RUNNER_UP of the best, a hill climb along its axis (draft tokens,
   then its tree setting): a neighbour measured, moving on that side while it is better, else the other;
4. at each other layout whose anchor came within LAYOUT_RUNNER_UP of the best's, the best setting there of each
   algorithm still within RUNNER_UP of the leader, and a hill climb from each within RUNNER_UP of the
   better (a larger batch per replica moves the best draft length).

A trial is told the figure it must reach (the leader's, less EARLY_STOP): the measurement may stop it once
it is clearly behind (`behind`), and it counts as a trial that cannot lead.
"""

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

OBJECTIVES = ("throughput", "latency", "energy")
SEARCHES = ("walk", "grid")
# A trial this far below the leader on the objective stops early; its partial figures cannot lead. Wide,
# so that a run's variation of a few percent never stops the best.
EARLY_STOP = 0.25
# An algorithm whose best is this close to the leader's is refined too: near-ties between algorithms (DDTree's
# spine verifies the chain DFlash verifies) are decided by measuring both.
RUNNER_UP = 0.05
# A layout whose anchor comes this close to the best layout's is searched too: a larger batch per replica
# moves the best draft length, so the anchor understates a layout that serves a shorter one best.
LAYOUT_RUNNER_UP = 0.10
BROKEN_LIMITS = 1e-6  # the weight of a trial that breaks the limits, in the walk's comparisons
# The fewest requests a running figure is judged on before a trial may stop early.
EARLY_STOP_MIN_REQUESTS = 8


@dataclass(frozen=True)
class Figures:
    """One concurrency level of a trial, as the serving benchmark reports it."""

    concurrency: int
    throughput: float  # output tokens/s, every replica together
    ttft_ms: float
    tpot_ms: float
    accept_length: float | None = None
    power_w: float | None = None  # the GPUs' mean power draw during the level (nvidia-smi power.draw), if read

    @property
    def request_speed(self) -> float:
        """One request's decode speed, tokens/s."""
        return 1000.0 / self.tpot_ms if self.tpot_ms > 0 else 0.0

    @property
    def tokens_per_joule(self) -> float | None:
        return self.throughput / self.power_w if self.power_w else None


@dataclass(frozen=True)
class Trial:
    levels: dict[int, Figures]
    stopped: bool = False  # ended early, clearly behind the leader


class Point(Protocol):
    """What the search reads of a candidate (tuning/candidates.py Candidate)."""

    baseline: bool
    algorithm: str  # what the comparison groups it by (the baseline's: autoregressive decoding)
    kind: tuple  # profile, algorithm and mode (spine or tree): one axis
    shape: tuple  # its layout: TP size and replicas
    axis: tuple  # where it lies on its kind's axis


@dataclass(frozen=True)
class Objective:
    name: str  # one of OBJECTIVES
    concurrency: int  # the level it reads
    max_tpot_ms: float | None = None
    max_ttft_ms: float | None = None

    def value(self, trial: Trial, concurrency: int | None = None) -> float | None:
        """The trial's figure on the objective at its level (or at `concurrency`, for a report of every level);
        None where the trial has no such figure (power unread)."""
        figures = trial.levels.get(concurrency or self.concurrency)
        if figures is None:
            return None
        return {"throughput": figures.throughput, "latency": figures.request_speed,
                "energy": figures.tokens_per_joule}[self.name]

    def meets(self, trial: Trial, concurrency: int | None = None) -> bool:
        """Whether the trial meets the limits at the objective's level (or at `concurrency`); a stopped trial
        never does."""
        figures = trial.levels.get(concurrency or self.concurrency)
        return (not trial.stopped and figures is not None
                and (self.max_tpot_ms is None or figures.tpot_ms <= self.max_tpot_ms)
                and (self.max_ttft_ms is None or figures.ttft_ms <= self.max_ttft_ms))


def objective(name: str, levels: tuple[int, ...], max_tpot_ms: float | None = None,
              max_ttft_ms: float | None = None) -> Objective:
    """The objective `name` over the concurrency `levels` asked; ValueError (one line) for one it cannot read."""
    if name not in OBJECTIVES:
        raise ValueError(f"objective={name!r} is not accepted: use one of {', '.join(OBJECTIVES)}")
    if name == "latency" and 1 not in levels:
        raise ValueError("objective=latency reads one request's speed at concurrency 1: add 1 to concurrency")
    return Objective(name, 1 if name == "latency" else max(levels), max_tpot_ms, max_ttft_ms)


def behind(running: float, bar: float | None, requests_done: int) -> bool:
    """Whether a trial whose running figure is `running` after `requests_done` requests is clearly behind the
    bar it was given (None: no leader yet, it runs to its end)."""
    return bar is not None and requests_done >= EARLY_STOP_MIN_REQUESTS and running < bar


@dataclass
class Result:
    """What a search measured: every trial in the order run, the winner (None where no drafting candidate
    meets the limits), and the grid it searched."""

    objective: Objective
    trials: list[tuple[Point, Trial]] = field(default_factory=list)
    winner: tuple[Point, Trial] | None = None
    grid: int = 0

    @property
    def baseline(self) -> tuple[Point, Trial] | None:
        return next(((p, t) for p, t in self.trials if p.baseline), None)

    def speedup(self, trial: Trial) -> float | None:
        """`trial` over the baseline on the objective."""
        base = self.baseline
        mine, theirs = self.objective.value(trial), base and self.objective.value(base[1])
        return mine / theirs if mine is not None and theirs else None


Measure = Callable[[Point, float | None], Trial]  # a candidate, the bar it may stop below -> its trial


def search(points: list[Point], measure: Measure, goal: Objective, how: str = "walk", anchor: Point | None = None,
           progress: Callable[[int, Point, Trial], None] | None = None) -> Result:
    """Measure candidates (`points`, the baseline among them) with `measure` and pick the best on `goal`: all
    of them (`how="grid"`) or the fewest the walk needs (the module's docstring), starting from `anchor`
    (the setting deployed; by default the last candidate)."""
    if how not in SEARCHES:
        raise ValueError(f"search={how!r} is not accepted: use one of {', '.join(SEARCHES)}")
    result = Result(goal, grid=len(points))
    measured: dict[int, Trial] = {}

    def leader() -> Point | None:
        eligible = [points[i] for i, t in measured.items()
                    if not points[i].baseline and goal.meets(t) and goal.value(t) is not None]
        return max(eligible, key=lambda p: goal.value(measured[points.index(p)]), default=None)

    def run(point: Point) -> Trial:
        index = points.index(point)
        if index not in measured:
            best = leader()
            bar = None if best is None or how == "grid" else goal.value(measured[points.index(best)]) * (1 - EARLY_STOP)
            measured[index] = measure(point, bar)
            result.trials.append((point, measured[index]))
            if progress:
                progress(len(result.trials), point, measured[index])
        return measured[index]

    baseline = next(p for p in points if p.baseline)
    run(baseline)
    if how == "grid":
        for point in points:
            run(point)
    else:
        _walk(points, run, goal, anchor, lambda: [points[i] for i in measured])
    best = leader()
    result.winner = None if best is None else (best, measured[points.index(best)])
    return result


def _walk(points, run, goal: Objective, anchor, measured_points) -> None:
    drafting = [p for p in points if not p.baseline]

    def axis_of(kind, shape):
        return sorted((p for p in drafting if p.kind == kind and p.shape == shape), key=lambda p: p.axis)

    def twin(point, shape):
        return next((p for p in drafting if p.kind == point.kind and p.axis == point.axis and p.shape == shape), None)

    def value(point):
        # What guides the walk: the objective, far below every trial meeting the limits for one that breaks
        # them (a stopped trial among them), so that a climb still moves towards the limits.
        trial = run(point)
        figure = goal.value(trial)
        if figure is None:
            return float("-inf")
        return figure if goal.meets(trial) else figure * BROKEN_LIMITS

    def climb(start):
        # Along a unimodal axis, a better neighbour says on which side the best lies: the other is not measured.
        line = axis_of(start.kind, start.shape)
        at = line.index(start)
        for step in ((-1, 1) if at >= len(line) / 2 else (1, -1)):  # towards the axis' middle first
            moved = False
            while 0 <= at + step < len(line) and value(line[at + step]) > value(line[at]):
                at, moved = at + step, True
            if moved:
                return

    def close(figure, top, margin=RUNNER_UP):
        return figure > float("-inf") and figure >= top * (1 - margin)

    if not drafting:
        return
    anchor = anchor if anchor in drafting else drafting[-1]
    shapes = sorted({p.shape for p in drafting if twin(anchor, p.shape)}, key=lambda shape: value(twin(anchor, shape)),
                    reverse=True)  # the anchor at every layout
    main = shapes[0]
    kinds = list(dict.fromkeys(p.kind for p in drafting if p.shape == main))
    # Each other algorithm at its setting nearest the anchor's, then a climb from each close to the best.
    starts = {kind: min(axis_of(kind, main), key=lambda p: sum((a - b) ** 2 for a, b in zip(p.axis, anchor.axis)))
              for kind in kinds}
    top = max(value(p) for p in starts.values())
    for point in sorted(starts.values(), key=value, reverse=True):
        if close(value(point), top):
            climb(point)
    top = max(value(p) for p in measured_points() if not p.baseline)
    # The best setting of each algorithm still close to the leader: what another layout starts from.
    bests = [max((p for p in drafting if p.kind == kind and p.shape == main and p in measured_points()), key=value)
             for kind in kinds]
    bests = [p for p in bests if close(value(p), top)]
    for shape in shapes[1:]:  # another layout close to the best: those settings there, a climb from the best
        if close(value(twin(anchor, shape)), value(twin(anchor, main)), LAYOUT_RUNNER_UP):
            twins = sorted((found for p in bests if (found := twin(p, shape)) is not None), key=value, reverse=True)
            for found in twins:
                if close(value(found), value(twins[0])):
                    climb(found)
