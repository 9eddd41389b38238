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

Concurrency is the number of requests being generated when a step starts.
Everything a client measures against the stand-in comes from these constants, which
is why the server reports them in /server_info under `lab_speed_model` and the
benchmark labels its outputs as a stand-in.
"""

import math
import threading
import time

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


class Engine:
    """Paces replies: callers take steps; the number running sets each step's length."""

    def __init__(self, algorithm: str | None, num_draft_tokens: int | None, ddtree_budget: int | None,
                 accept_length: float):
        self.speculative = algorithm is not None
        self.width = width(algorithm, num_draft_tokens, ddtree_budget)
        self.accept_length = accept_length
        self.running = 0
        self.lock = threading.Lock()

    def describe(self) -> dict:
        return {"note": "LAB STAND-IN speed model (lab/sglang_standin/sglang/speed_model.py): "
                        "modelled timings, not a measurement",
                "step_s": STEP_S, "step_token_budget": STEP_TOKEN_BUDGET, "draft_overhead": DRAFT_OVERHEAD,
                "prefill_s": PREFILL_S, "slots_per_request": self.width, "accept_length": self.accept_length}

    def steps(self, total_tokens: int):
        """Yield how many new tokens each step produced, sleeping each step's modelled time."""
        with self.lock:
            self.running += 1
        try:
            time.sleep(PREFILL_S)
            done, step = 0, 0
            while done < total_tokens:
                with self.lock:
                    batch = self.running
                time.sleep(step_seconds(batch, self.width, self.speculative))
                step += 1
                now = min(total_tokens, tokens_after(step, self.accept_length))
                yield now - done
                done = now
        finally:
            with self.lock:
                self.running -= 1
