"""LAB STAND-IN speed model: how fast the stand-in engine pretends to decode. NOT a measurement.

The lab has no GPU, so a serving benchmark against the stand-in would time Python
sleeps and nothing else. This model makes those sleeps follow a fixed, documented
rule, so a sweep has a shape (speculation wins at low concurrency, loses its edge
when the batch is large) while every number stays a product of the constants below:

- A decode step of the engine takes STEP_S seconds while the batch needs at most
  STEP_TOKEN_BUDGET verified token slots; beyond that the step grows in proportion
  (the GPU's fixed compute per step is shared by the batch).
- Each running request needs `width` slots a step: 1 without speculation, the
  draft block (num_draft_tokens) for DFlash, the tree budget + 1 for DDTree.
- A speculative step also runs the drafter: DRAFT_OVERHEAD more time.
- Each step gives every request `accept_length` tokens on average (1 without
  speculation); request i's k-th step ends with floor(k * accept_length) tokens.

The rank-0 scheduler (srt/managers/scheduler.py) runs the batch: a prefill batch of PREFILL_S
admits the waiting requests, then every decode step advances all running requests together, and
concurrency is the number running when a step starts.
Everything a client measures against the stand-in comes from these constants, which
is why the server reports them in /server_info under `lab_speed_model` and the
benchmark labels its outputs as a stand-in.
"""

import math

STEP_S = 0.02  # one decode step of a batch that fits the budget (50 steps/s)
STEP_TOKEN_BUDGET = 64  # verified token slots a step holds before it takes longer
DRAFT_OVERHEAD = 0.25  # the drafter's share on top of a speculative step
PREFILL_S = 0.01  # before the first step of a request (prompt processing)


def width(algorithm: str | None, num_draft_tokens: int | None, ddtree_budget: int | None) -> int:
    """Verified token slots one request needs per step."""
    if algorithm is None:
        return 1
    if algorithm == "DDTREE" and ddtree_budget is not None:
        return ddtree_budget + 1
    return num_draft_tokens or 1


def step_seconds(batch: int, slots_per_request: int, speculative: bool) -> float:
    """How long one engine step takes with `batch` requests running."""
    load = max(1.0, batch * slots_per_request / STEP_TOKEN_BUDGET)
    return STEP_S * load * (1 + DRAFT_OVERHEAD if speculative else 1)


def tokens_after(steps: int, accept_length: float) -> int:
    """Tokens a request holds after `steps` steps."""
    return math.floor(steps * accept_length + 1e-9)


def describe(width: int, accept_length: float) -> dict:
    """What /server_info reports under `lab_speed_model`."""
    return {"note": "LAB STAND-IN speed model (lab/sglang_standin/sglang/speed_model.py): "
                    "modelled timings, not a measurement",
            "step_s": STEP_S, "step_token_budget": STEP_TOKEN_BUDGET, "draft_overhead": DRAFT_OVERHEAD,
            "prefill_s": PREFILL_S, "slots_per_request": width, "accept_length": accept_length}
