"""LAB STAND-IN speed model: how fast the stand-in engine pretends to decode. MODELLED, NOT MEASURED.

The lab has no GPU, so a serving benchmark against the stand-in would time Python sleeps and nothing
else. This model makes those sleeps follow fixed, documented curves, so that a sweep (bench.py) and a
tune (tune.py) face the questions real hardware asks, while every number stays a product of the
constants below. Each constant says which published result or seed measurement it stands for; none
was measured here, and a lab figure is the model's, never the hardware's.

Accept length (tokens a request gains a step), `accept_length`:
- Without speculation 1. A drafted chain of k tokens (DFlash's block of n verifies k = n - 1; DDTree's
  spine, budget <= n - 1, verifies k = budget) is accepted position by position at the target's
  `accept_rate` r (TARGETS), the bonus token included: 1 + r + r^2 + ... + r^k. A saturating curve:
  each further draft token adds less (r^k), as DFlash's acceptance flattens with block length.
- A tree (DDTree budget above n - 1) verifies siblings of the spine too: + TREE_GAIN a doubling of the
  budget over the spine (log2), diminishing, the DDTree paper's tree gaining a little over its chain.
- On a hybrid target (config.json's `layer_types` with linear attention or Mamba layers, as Qwen3.6's),
  a tree loses RECURRENT_LEAK a doubling, times the share of recurrent layers: their state is one per
  sequence, and a tree's branches leak into it (the seed's Qwen3.6-27B sweeps: budgets above 15, the
  spine, lost; DDTree PR #29907's tree-aware Mamba verify is what tries to mend it).
- The drafters that draft one token a pass, feeding their guesses back (`DRAFTERS`: EAGLE and NEXTN,
  its alias, through the target's own multi-token-prediction layers, what the lab's profiles draft
  with through them; EAGLE3 with its drafter head; NGRAM from the n-grams already seen) accept their
  first position at their own rate, each further one at DECAY times the one before: 1 + r + r(rd) +
  ...; their chain is `num_steps` long (NGRAM's draft tokens - 1), and `eagle_topk` above 1 drafts a
  tree: + TREE_GAIN a doubling of topk, less the recurrent leak as above.

Step time of one server (`Pace.step_seconds`), a batch of b requests each verifying w slots a step (1
without speculation, n for DFlash, budget + 1 for DDTree) on TP size t:
- weights_s / t: a decode step reads the weights once (memory-bound), split over the TP ranks;
- b * w * token_s / t: each verified slot's compute, so verifying more costs more, and at a large
  batch the verify's cost outgrows what the accepted tokens bring (speculation's edge shrinks);
- at t > 1, the all-reduces of the step: `collectives` of them (two a layer), each taking
  2(t - 1) ring steps of the link's HOP_S and b * w tokens of `allreduce_bytes` at the link's bus
  bandwidth (nccl-tests' busbw: an all-reduce of B bytes moves 2(t-1)/t B a rank);
- a speculative step runs the drafter too: DRAFT_OVERHEAD more time for DFlash's (and DDTree's) one
  pass of a block; DRAFT_PASS a pass for the drafters that draft a token a pass (`num_steps` passes);
  NGRAM_LOOKUP for NGRAM's lookup, which runs no model.

What comes out, for Qwen3.6-27B on one GPU at one request (tests/lab_code/test_sglang_standin.py):
DFlash's best (a 16-token block) ~6.3x autoregressive decoding, MTP's best (6 steps; LMSYS chose 7 for it)
~3.3x, so DFlash ~1.9x MTP, between the two published gaps (1.5x: LMSYS, Qwen3.5-397B on 8x B200;
2.1x: z-lab's Qwen3.5-4B-DFlash card, one B200, Math500); EAGLE-3's best ~2.6x autoregressive decoding,
DFlash ~2.4x it (the DFlash paper: up to 2.5x over EAGLE-3); NGRAM ~1.5x at one request, losing to
autoregressive decoding as the batch grows.

The link (`Link`) is what NCCL takes between the server's GPUs: the lab's torch stand-in
(torch/_gpus.py `ring`) decides it from the GPU profile's topology and the process's environment
(NCCL_P2P_DISABLE=1 is the host-memory path), with the profile's bus bandwidth (real captures for
NVLink and for the host-memory path, synthesized for PCIe P2P). With --nnodes > 1 the ring is the
node's own GPUs: the network between nodes is not modelled. Step times are the RTX PRO 6000's on every
class (the model knows no other card); a model type not in TARGETS gets DEFAULT_TARGET.

The rank-0 scheduler (srt/managers/scheduler.py) runs the batch: a prefill batch of PREFILL_S admits
the waiting requests, then every decode step advances all running requests together (request i's
k-th step ends with floor(k * accept_length) tokens), and the batch is the number running when a step
starts. The server reports the model's figures in /server_info under `lab_speed_model`, and the
benchmark labels its outputs as a stand-in's.
"""

import math
from dataclasses import asdict, dataclass

PREFILL_S = 0.01  # before the first step of a request (prompt processing)
# The drafter's share on top of a speculative step: the lab's long-standing pace of the deployed Kimi
# DFlash (20 ms steps, 25 ms drafted), not a measurement.
DRAFT_OVERHEAD = 0.25
# A doubling of a tree's budget over its spine: +6 % accepted (the DDTree paper, arXiv 2604.12989: its
# trees gain modestly over the DFlash chain they grow from, the gain flattening with the budget).
TREE_GAIN = 0.06
# A doubling of the budget over the spine on a fully recurrent target: -30 % accepted (modelled so that
# Qwen3.6's 3 recurrent layers in 4 lose beyond the spine, as the seed's sweeps found).
RECURRENT_LEAK = 0.30
RECURRENT_LAYERS = ("linear_attention", "mamba")  # config.json layer_types that keep a recurrent state
# One ring step of an all-reduce, by the path NCCL takes (modelled on the order of nccl-tests'
# small-message times; the host-memory path set so that, at 8 requests and more, TP > 1 loses to TP 1
# replicas on the PCIe box with P2P off, as the seed's Qwen3.6-27B measurements found; one request alone
# still runs a little faster over TP 2 there).
HOP_S = {"nvlink": 2e-6, "pcie": 5e-6, "host": 60e-6}
# One sequential draft pass of a one-layer drafter (an EAGLE-3 head, a model's MTP layer and the lm_head
# it shares): set so that 4 passes cost more than DFlash's one block pass (DRAFT_OVERHEAD), as the DFlash
# authors report (LMSYS blog "DFlash and Spec V2", 2026-06-15: a 5-layer DFlash drafter drafting 16
# tokens takes less time than a one-layer EAGLE-3 drafter drafting 4).
DRAFT_PASS = 0.065
# NGRAM drafts from a trie of the n-grams seen, on the CPU, with no model: a small share of a step (an
# assumption, no published figure).
NGRAM_LOOKUP = 0.02


@dataclass(frozen=True)
class Drafter:
    """How an algorithm that drafts a token a pass accepts (module docstring): its first position's rate, the
    decay of each further one, and the cost of a pass."""

    accept_rate: float
    decay: float
    pass_overhead: float  # a sequential draft pass's share of a step
    passes: str = "num_steps"  # what counts the passes: num_steps, or "once" for a lookup without a model


# By SGLang's --speculative-algorithm. DFlash's and DDTree's acceptance is the target's (`Target.accept_rate`).
DRAFTERS = {
    # The target's own MTP layers (Qwen3.5/3.6's models/qwen3_5_mtp.py), drafted through EAGLE or NEXTN:
    # 0.92 then x0.97 a position, set so that its best on Qwen3.6-27B at one request (6 steps; LMSYS chose 7
    # for MTP on Qwen3.5-397B) is ~1.9x below DFlash's best: LMSYS measured DFlash 1.5x over MTP on
    # Qwen3.5-397B-A17B (8x B200, HumanEval, concurrency 1), z-lab's Qwen3.5-4B-DFlash card 2.1x (one B200,
    # Math500, 959 vs 458 tok/s).
    "EAGLE": Drafter(accept_rate=0.92, decay=0.97, pass_overhead=DRAFT_PASS),
    "NEXTN": Drafter(accept_rate=0.92, decay=0.97, pass_overhead=DRAFT_PASS),
    # An EAGLE-3 drafter head: 0.85 then x0.95, set so that its best is ~2.6x autoregressive decoding at one
    # request and DFlash's ~2.4x it: SGLang's speculative decoding docs measure EAGLE-3 at 2.4x (Llama-3.1-8B-
    # Instruct, MT-bench, one H100: 158 vs 373 tok/s); the DFlash paper (arXiv 2602.06036) reports up to 2.5x
    # over EAGLE-3.
    "EAGLE3": Drafter(accept_rate=0.85, decay=0.95, pass_overhead=DRAFT_PASS),
    # Prompt lookup over the request's own n-grams: 0.4 then x0.9, an assumption (no published SGLang figure
    # on chat traffic) that gives ~1.5x at one request on Qwen3.6-27B and loses beyond a few requests.
    "NGRAM": Drafter(accept_rate=0.4, decay=0.9, pass_overhead=NGRAM_LOOKUP, passes="once"),
}


@dataclass(frozen=True)
class Target:
    """A target model's speed, as its real weights would run on one RTX PRO 6000 (the seed's card)."""

    weights_s: float  # reading the weights once at TP 1
    token_s: float  # one verified token's compute at TP 1
    collectives: int  # all-reduces a step: two a layer
    allreduce_bytes: int  # per token and all-reduce: the hidden size in bf16
    accept_rate: float  # the drafter's acceptance per position of its chain
    recurrent_share: float = 0.0  # layers with a recurrent state (linear attention, Mamba), from config.json


# By the target's model_type (text_config's where it has one). The lab's configs are tiny; the figures
# are the real models'.
TARGETS = {
    # Qwen3.6-27B (bf16, ~54 GB: 30 ms at the card's ~1.8 TB/s; 64 layers, hidden 5120 as its model card
    # gives them, not checked against the shared notes; ~54 GFLOP a token: 0.4 ms at ~135 TFLOPS, set so
    # that at 64 requests a shorter chain than 16 pays, the seed's narrowing advantage). accept_rate 0.925:
    # DDTree's spine at budget 15 (a 16-token chain) on one GPU comes out ~6.3x autoregressive decoding at
    # concurrency 1, near the seed's 6.5x (shared/notes/fleet.md).
    "qwen3_5": Target(weights_s=0.030, token_s=0.0004, collectives=128, allreduce_bytes=2 * 5120,
                      accept_rate=0.925),
    # Kimi K2.6 (61 layers, hidden 7168; its experts spread over 8 cards). weights_s set so that the
    # deployed setting, DFlash block 8 at TP 8 on the lab's PCIe box, keeps the lab's pace of a 20 ms
    # step (25 ms drafted); 0.7348: 3.45 tokens accepted at block 8, the lab's long-standing figure.
    "kimi_k2": Target(weights_s=0.0853, token_s=0.0002, collectives=122, allreduce_bytes=2 * 7168,
                      accept_rate=0.7348),
}
DEFAULT_TARGET = Target(weights_s=0.02, token_s=0.0001, collectives=64, allreduce_bytes=2 * 4096, accept_rate=0.8)


def target(config: dict) -> Target:
    """The speed of the model whose config.json is `config`: its model type's, with its recurrent layers."""
    text = config.get("text_config", config)
    found = TARGETS.get(text.get("model_type"), DEFAULT_TARGET)
    kinds = text.get("layer_types") or []
    share = sum(kind in RECURRENT_LAYERS for kind in kinds) / len(kinds) if kinds else 0.0
    return Target(**{**asdict(found), "recurrent_share": share})


@dataclass(frozen=True)
class Link:
    """The path an all-reduce takes between the server's GPUs: NCCL's transport and its bus bandwidth."""

    transport: str  # a key of HOP_S
    busbw_gbps: float


def link(ring: dict) -> Link:
    """The link of a ring as the torch stand-in describes it (torch/_gpus.py `ring`): P2P over NVLink or
    PCIe, else host memory; its bandwidth the profile's largest measured size's."""
    if not all(ring["p2p"]):
        transport = "host"
    else:
        transport = "nvlink" if all(hop == "NVL" for hop in ring["hops"]) else "pcie"
    sizes = ring["busbw_gbps"]
    return Link(transport, sizes[max(sizes)] if sizes else 0.0)


def chain(algorithm: str | None, num_draft_tokens: int | None, ddtree_budget: int | None,
          num_steps: int | None = None) -> int:
    """Draft tokens the verify's chain holds: DFlash's block less its verified token, DDTree's spine, an
    EAGLE-family drafter's steps."""
    spine = max((num_draft_tokens or 1) - 1, 0)
    if algorithm == "DDTREE" and ddtree_budget is not None:
        return min(ddtree_budget, spine)
    if algorithm in DRAFTERS and DRAFTERS[algorithm].passes == "num_steps" and num_steps is not None:
        return min(num_steps, spine)
    return spine


def _tree_factor(model: Target, doublings: float) -> float:
    """A tree's acceptance over its chain's (module docstring): gained a doubling, leaked on a hybrid target."""
    return (1 + TREE_GAIN * doublings) * max(0.0, 1 - RECURRENT_LEAK * model.recurrent_share * doublings)


def accept_length(model: Target, algorithm: str | None, num_draft_tokens: int | None,
                  ddtree_budget: int | None, num_steps: int | None = None, eagle_topk: int | None = None) -> float:
    """Tokens a request gains a step (the module's docstring), to 2 decimals as the server reports it."""
    if algorithm is None:
        return 1.0
    length = chain(algorithm, num_draft_tokens, ddtree_budget, num_steps)
    drafter = DRAFTERS.get(algorithm)
    if drafter is not None:
        accepted, reached = 1.0, 1.0
        for position in range(length):
            reached *= drafter.accept_rate * drafter.decay ** position
            accepted += reached
        if eagle_topk is not None and eagle_topk > 1:
            accepted *= _tree_factor(model, math.log2(eagle_topk))
        return round(max(accepted, 1.0), 2)
    rate = model.accept_rate
    accepted = (1 - rate ** (length + 1)) / (1 - rate)
    spine = max(length, 1)
    if algorithm == "DDTREE" and ddtree_budget is not None and ddtree_budget > spine:
        accepted *= _tree_factor(model, math.log2(ddtree_budget / spine))
    return round(max(accepted, 1.0), 2)


def width(algorithm: str | None, num_draft_tokens: int | None, ddtree_budget: int | None) -> int:
    """Verified token slots one request needs per step."""
    if algorithm is None:
        return 1
    if algorithm == "DDTREE" and ddtree_budget is not None:
        return ddtree_budget + 1
    return num_draft_tokens or 1


def draft_overhead(algorithm: str | None, num_draft_tokens: int | None, num_steps: int | None = None) -> float:
    """The drafter's share on top of a step (module docstring): 0 without speculation."""
    if algorithm is None:
        return 0.0
    drafter = DRAFTERS.get(algorithm)
    if drafter is None:
        return DRAFT_OVERHEAD
    passes = 1 if drafter.passes == "once" else chain(algorithm, num_draft_tokens, None, num_steps)
    return drafter.pass_overhead * passes


@dataclass(frozen=True)
class Pace:
    """One server's step time: its target, TP size and link, the slots a request verifies, drafting or not."""

    model: Target
    tp_size: int
    link: Link | None  # None at TP 1: no all-reduce
    slots: int
    speculative: bool
    overhead: float = DRAFT_OVERHEAD  # the drafter's share on top of a speculative step (draft_overhead)

    def allreduce_seconds(self, batch: int) -> float:
        if self.tp_size < 2 or self.link is None:
            return 0.0
        t, m = self.tp_size, self.model
        moved = batch * self.slots * m.allreduce_bytes * 2 * (t - 1) / t
        bandwidth = self.link.busbw_gbps * 1e9
        return m.collectives * (2 * (t - 1) * HOP_S[self.link.transport] + (moved / bandwidth if bandwidth else 0.0))

    def step_seconds(self, batch: int) -> float:
        """How long one engine step takes with `batch` requests running."""
        m = self.model
        compute = (m.weights_s + batch * self.slots * m.token_s) / self.tp_size
        return (compute + self.allreduce_seconds(batch)) * (1 + self.overhead if self.speculative else 1)


def server(model: Target, algorithm: str | None, num_draft_tokens: int | None, ddtree_budget: int | None,
           tp_size: int, link: Link | None, num_steps: int | None = None,
           eagle_topk: int | None = None) -> tuple[Pace, float]:
    """A server's step time and accept length for its target, speculative settings, TP size and link."""
    return (Pace(model, tp_size, link if tp_size > 1 else None, width(algorithm, num_draft_tokens, ddtree_budget),
                 algorithm is not None, draft_overhead(algorithm, num_draft_tokens, num_steps)),
            accept_length(model, algorithm, num_draft_tokens, ddtree_budget, num_steps, eagle_topk))


def tokens_after(steps: int, accept_length: float) -> int:
    """Tokens a request holds after `steps` steps."""
    return math.floor(steps * accept_length + 1e-9)


def describe(pace: Pace, accept_length: float) -> dict:
    """What /server_info reports under `lab_speed_model`."""
    return {"note": "LAB STAND-IN speed model (lab/sglang_standin/sglang/speed_model.py): "
                    "modelled timings, not a measurement",
            "step_s": round(pace.step_seconds(1), 6), "draft_overhead": pace.overhead if pace.speculative else 0.0,
            "prefill_s": PREFILL_S,
            "slots_per_request": pace.slots, "accept_length": accept_length, "tp_size": pace.tp_size,
            "link": asdict(pace.link) if pace.link else None, "target": asdict(pace.model)}
