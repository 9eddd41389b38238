"""The speculative algorithms, one entry each: its SGLang flags, the engine rules it is held to, its
/server_info fields and what the bench (and a tuner) may vary. Flags, checks, the bench and the tests
read this table; a new algorithm is a new entry."""

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field

# Target backends that force KV pages above one token (0.5.23 srt/arg_groups/overrides.py,
# _mla_backend_page_constraints: trtllm_mha moves any other page size to one of 16/32/64/128,
# trtllm_mla forces 32/64), run before the speculative hook.
PAGED_BACKENDS = ("trtllm_mha", "trtllm_mla")
# What /server_info says of any speculative server (ServerArgs.resolved_dict, 0.5.23); each algorithm's
# settings add `speculative_<setting>`.
SERVER_INFO = ("speculative_algorithm", "speculative_num_draft_tokens")


@dataclass(frozen=True)
class Setting:
    """One optional setting of a profile's `speculative` (beyond algorithm and num_draft_tokens): its
    SGLang flag and the values the engine accepts, which is what a tuner may vary it over."""

    flag: str
    low: int = 1
    high: int | None = None
    # The values a tuner tries (tuning/), each kept only where the algorithm's rules accept it (`violations`).
    tried: tuple[int, ...] = ()


@dataclass(frozen=True)
class Resolved:
    """What an algorithm's own rules judge: its draft tokens, its set settings, the KV page size (None: set by
    the target backend) and the target attention backend, as the deploy resolves them."""

    num_draft_tokens: int
    values: dict[str, int]
    page_size: int | None
    attention_backend: str | None


# One engine rule of an algorithm's own, beyond its page size and tree mode: the engine's refusal of these
# settings in its words, else None. Each is taken from the SGLang code that refuses it (its post-init or
# startup checks), so that preflight and the tuner refuse what the engine would.
Rule = Callable[[Resolved], str | None]


@dataclass(frozen=True)
class Algorithm:
    """One speculative algorithm (or AR: none), as the deploy renders it and the engine judges it."""

    name: str  # what a profile's `algorithm` names; the bench's mode is its lower case
    # SGLang's --speculative-algorithm, what /server_info reports, where it is not `name` (MTP drafts
    # through SGLang's EAGLE path).
    engine_name: str | None = None
    drafts: bool = True  # False: autoregressive, no speculative flag at all
    # Whether it drafts with a separate drafter repo (--speculative-draft-model-path), which its profile
    # names, its host fetches and its tuned file is measured with; False: AR, or a model's own draft layers.
    drafter: bool = True
    # Whether a draft model runs (a drafter repo or the target's own draft layers), whose attention backend
    # the deploy sets (--speculative-draft-attention-backend); False: AR, NGRAM (it drafts from a token trie).
    draft_model: bool = True
    # Whether SGLang sizes its draft's KV in the target's pool as the target's cell per draft layer (the EAGLE
    # family: 0.5.23 model_executor/pool_configurator.py DefaultPoolConfigurator.__init__) rather than from a
    # drafter's own config (DFlash: mem_cache/draft_kv_budget.py resolve_dflash_draft_cell_size).
    draft_kv_of_target: bool = False
    # The draft-token counts a tuner tries, those at most the drafter's block size (the profile's
    # num_draft_tokens, which is always tried); () tries the block size alone.
    draft_lengths: tuple[int, ...] = ()
    settings: dict[str, Setting] = field(default_factory=dict)  # the profile's optional settings
    page_size: int | None = None  # the KV page size its verify needs; None: any
    # The setting above draft tokens - 1 that makes it verify a tree instead of one chain (spine mode),
    # and the target backends the tree verify runs on.
    tree: str | None = None
    tree_backends: tuple[str, ...] = ()
    rules: tuple[Rule, ...] = ()  # its own engine rules (`Rule`), which `violations` adds
    # In no release (up to 0.5.23): the pull request that has it, the release algorithm it builds on,
    # the prose name and an example build to point a profile at.
    pull_request: int | None = None
    base: str | None = None
    label: str = ""
    build: str = ""

    @property
    def mode(self) -> str:
        """Its name among the bench's modes."""
        return self.name.lower()

    @property
    def sglang_name(self) -> str:
        """Its --speculative-algorithm, and the speculative_algorithm /server_info reports."""
        return self.engine_name or self.name

    @property
    def server_info(self) -> tuple[str, ...]:
        """The /server_info fields that report its settings (none for AR)."""
        return (*SERVER_INFO, *(f"speculative_{key}" for key in self.settings)) if self.drafts else ()

    def builds_tree(self, num_draft_tokens: int, size: int | None) -> bool:
        """Whether it verifies a tree (its tree setting above draft tokens - 1) rather than its spine, one
        chain; no size is the default, draft tokens - 1."""
        return self.tree is not None and size is not None and size > num_draft_tokens - 1

    def tried(self, num_draft_tokens: int, kept: dict[str, int]) -> list["Speculative"]:
        """The settings a tuner tries of it for a drafter of block `num_draft_tokens`: each draft length up
        to the block, at every combination of the values its settings try (`Setting.tried`; the tree
        setting's spine default among them) that their bounds allow; `kept`: the profile's values of its
        other settings (DFlash's draft window), unchanged. Whether its rules and the target backend allow
        a combination is `violations`' to say, per deployment."""
        if not self.drafts:
            return [Speculative(self.name, num_draft_tokens)]
        lengths = sorted({n for n in self.draft_lengths if n < num_draft_tokens} | {num_draft_tokens})
        varied = [key for key, setting in self.settings.items() if setting.tried]
        others = {key: value for key, value in kept.items() if key in self.settings and key not in varied}
        found = []
        for length in lengths:
            ranges = [self._tried_values(key, length) for key in varied]
            found += [Speculative(self.name, length, {**others, **dict(zip(varied, combination))})
                      for combination in itertools.product(*ranges)]
        return found

    def _tried_values(self, key: str, num_draft_tokens: int) -> list[int]:
        """The values a tuner tries of one setting at a draft length: its tried ones (the tree setting's spine
        default too), within its bounds."""
        setting = self.settings[key]
        default = {self.spine(num_draft_tokens)} if key == self.tree else set()
        return [value for value in sorted({*setting.tried, *default})
                if setting.low <= value <= (setting.high or value)]

    def spine(self, num_draft_tokens: int) -> int:
        """The tree setting's default: draft tokens - 1, one chain (PR #29907 speculative/ddtree_worker.py)."""
        return num_draft_tokens - 1

    def target_backend(self, backend: str, num_draft_tokens: int, size: int | None) -> str:
        """The target backend it runs in place of `backend`: `backend` where it allows the pages it needs and
        the mode allows it (any in spine mode), else the tree verify's first backend."""
        if (self.page_size == 1 and backend in PAGED_BACKENDS) or (
                self.builds_tree(num_draft_tokens, size) and backend not in self.tree_backends):
            return self.tree_backends[0]
        return backend

    def violations(self, page_size: int | None, attention_backend: str | None, size: int | None,
                   num_draft_tokens: int, values: dict[str, int] | None = None) -> list[str]:
        """Why the engine would refuse these (resolved) settings, in its words; [] if it accepts them;
        `values`: its set settings, which its own `rules` judge (None: none set)."""
        problems = []
        if self.page_size is not None and page_size != self.page_size:
            problems.append(f"{self.name} currently supports only page_size == {self.page_size} (page size "
                            f"{page_size if page_size is not None else f'set by {attention_backend}'})")
        if self.builds_tree(num_draft_tokens, size) and attention_backend not in self.tree_backends:
            problems.append(f"{self.name} tree mode (budget {size} > draft tokens - 1 = {num_draft_tokens - 1}) "
                            f"needs the target attention backend {', '.join(self.tree_backends)}, not "
                            f"{attention_backend}")
        if self.tree is not None and size is not None:
            low, high = self.settings[self.tree].low, self.settings[self.tree].high
            if not low <= size <= high:
                problems.append(f"{self.name} budget must be within [{low}, {high}], not {size}")
        resolved = Resolved(num_draft_tokens, values or {}, page_size, attention_backend)
        return problems + [said for rule in self.rules if (said := rule(resolved))]


AR = Algorithm("AR", drafts=False, drafter=False, draft_model=False)
# DFlash verifies one block of draft tokens a step; fewer than the drafter's block verify less per step,
# which pays at high concurrency, where verification competes with other requests for the GPU (TRT-LLM's
# DFlash config schedules its draft length by concurrency). Whether an SGLang build accepts a count
# below the drafter's block size is its own rule: a trial's flags are validated by it before it starts.
DFLASH = Algorithm("DFLASH", settings={"draft_window_size": Setting("--speculative-draft-window-size")},
                   draft_lengths=(4, 8, 12))
# DDTree (open PR #29907, in no release): its verify needs one-token KV pages ("DDTREE currently
# supports only page_size == 1"). A budget <= draft tokens - 1 (the PR's default) is spine mode: one
# chain, verified as DFLASH verifies it; only a larger budget builds a tree (speculative/ddtree_worker.py
# at 93e9850e4), and only the tree verify needs the triton target backend (_handle_ddtree). A budget is
# the number of tree nodes verified per step: at least one; at most 1024, the largest budget the DDTree
# paper's reference code runs (liranringel/ddtree benchmark.py). A tuner tries spine budgets below the
# default (fewer tokens verified a step) and tree budgets up to the paper's 128 (its gains flatten beyond).
DDTREE = Algorithm(
    "DDTREE", page_size=1,
    settings={"ddtree_budget": Setting("--speculative-ddtree-budget", 1, 1024, tried=(3, 7, 11, 31, 63, 127))},
    tree="ddtree_budget", tree_backends=("triton",),  # PR #29907 since 93e9850e4: the full-tree verify is triton-only
    pull_request=29907, base="DFLASH", label="DDTree",
    build="sglang @ git+https://github.com/sgl-project/sglang@COMMIT#subdirectory=python")

# The target backends that draft a tree (top-k > 1) over pages of more than one token: 0.5.23
# srt/arg_groups/speculative_hook.py _handle_eagle_family, its _PAGE_TREE_SPEC_BACKENDS.
EAGLE_PAGED_TREE_BACKENDS = ("flashinfer", "fa3", "triton")


def eagle_rules(resolved: Resolved) -> str | None:
    """SGLang 0.5.23's refusals of the EAGLE family's settings (srt/arg_groups/speculative_hook.py
    _handle_eagle_family), in its words: with draft tokens given, steps and top-k must be too (it asserts,
    then compares top-k with 1); at top-k 1 it moves draft tokens to steps + 1 (a warning the deploy refuses:
    the server would not serve what the profile says); trtllm_mha verifies chains only; a tree over pages
    above one token needs one of the backends that implement the two-pass draft decode."""
    steps, topk = resolved.values.get("num_steps"), resolved.values.get("eagle_topk")
    if steps is None or topk is None:
        return ("speculative_num_steps and speculative_eagle_topk must be set with speculative_num_draft_tokens "
                "(_handle_eagle_family asserts speculative_eagle_topk is None and speculative_num_draft_tokens "
                "is None when speculative_num_steps is unset): set num_steps and eagle_topk")
    if topk == 1 and resolved.num_draft_tokens != steps + 1:
        return (f"speculative_num_draft_tokens is adjusted to speculative_num_steps + 1 when "
                f"speculative_eagle_topk == 1 ({resolved.num_draft_tokens} != {steps} + 1): set num_draft_tokens "
                f"{steps + 1}")
    if topk > 1 and resolved.attention_backend == "trtllm_mha":
        return "trtllm_mha backend only supports topk = 1 for speculative decoding."
    if topk > 1 and resolved.page_size != 1 and resolved.attention_backend not in EAGLE_PAGED_TREE_BACKENDS:
        return (f"speculative_eagle_topk > 1 with page_size > 1 is only supported on {EAGLE_PAGED_TREE_BACKENDS}; "
                f"got attention_backend={resolved.attention_backend!r}. Use page_size == 1 or one of those "
                "backends.")
    return None


# What the EAGLE family (MTP, EAGLE-3) drafts: `num_steps` draft passes of `eagle_topk` candidates each,
# verifying num_draft_tokens of the tree (topk 1: a chain of steps + 1). Bounds: the engine takes any
# positive count; a tuner tries chains of 1-3 steps (SGLang's own default is 3 steps, topk 1, 4 tokens:
# _auto_choose_speculative_params) and, for EAGLE-3, one small tree (topk 4, its Llama default).
EAGLE_STEPS = Setting("--speculative-num-steps", tried=(1, 2, 3))
EAGLE_TOPK = Setting("--speculative-eagle-topk", tried=(1,))
# A model's own multi-token-prediction layers (Qwen3.5/3.6: models/qwen3_5_mtp.py; DeepSeek, GLM: their
# nextn models), drafting through SGLang's EAGLE worker: the model cards' --speculative-algorithm NEXTN is
# an alias the engine resolves to EAGLE (srt/speculative/spec_registry.py _RESERVED_ALIASES,
# arg_groups/speculative_hook.py _resolve_speculative_algorithm_alias), so the deploy names EAGLE, which
# /server_info reports. No drafter path: the draft worker loads the target's checkpoint as its MTP
# form (configs/model_config.py from_server_args takes the target path; _config_draft_model rewrites
# Qwen3_5ForConditionalGeneration to Qwen3_5ForCausalLMMTP with one layer). Draft lengths a tuner tries
# below the profile's: chains of 2 and 3 tokens, each steps + 1 at topk 1 (eagle_rules).
MTP = Algorithm("MTP", engine_name="EAGLE", drafter=False, draft_kv_of_target=True, draft_lengths=(2, 3),
                settings={"num_steps": EAGLE_STEPS, "eagle_topk": EAGLE_TOPK}, rules=(eagle_rules,))
# EAGLE-3 (in SGLang releases): a drafter repo of its own (models/llama_eagle3.py, kimi_k25_eagle3.py),
# fed the target's hidden states; its rules are the EAGLE family's.
EAGLE3 = Algorithm("EAGLE3", draft_kv_of_target=True, draft_lengths=(2, 3, 4, 6),
                   settings={"num_steps": EAGLE_STEPS,
                             "eagle_topk": Setting("--speculative-eagle-topk", tried=(1, 4))},
                   rules=(eagle_rules,))

# NGRAM's default breadth (--speculative-ngram-max-bfs-breadth, 0.5.23 srt/server_args.py), which
# _handle_ngram makes its eagle_topk.
NGRAM_DEFAULT_BREADTH = 10


def ngram_rules(resolved: Resolved) -> str | None:
    """SGLang 0.5.23's refusal of NGRAM's settings on the target backend (srt/arg_groups/speculative_hook.py
    _handle_ngram), in its words: a trie wider than one (its breadth, which it makes eagle_topk) over pages
    above one token runs on flashinfer only. Its other refusals meet nothing the deploy renders: a device
    other than CUDA, CPU or XPU, attention data parallelism, an external corpus."""
    breadth = resolved.values.get("ngram_max_bfs_breadth", NGRAM_DEFAULT_BREADTH)
    if breadth > 1 and resolved.page_size != 1 and resolved.attention_backend != "flashinfer":
        page = resolved.page_size if resolved.page_size is not None else f"set by {resolved.attention_backend}"
        return (f"speculative_eagle_topk({breadth}) > 1 with page_size({page}) > 1 is unstable and produces "
                "incorrect results for paged attention backends. This combination is only supported for the "
                "'flashinfer' backend.")
    return None


# N-gram speculation: drafts from a trie of the tokens already seen, no draft model (SGLang's default is 12
# draft tokens over a breadth-10 trie: _handle_ngram, server_args.py). A tuner tries shorter drafts and
# narrower tries (a chain, breadth 1, runs on any backend).
NGRAM = Algorithm("NGRAM", drafter=False, draft_model=False, draft_lengths=(4, 8),
                  settings={"ngram_max_bfs_breadth": Setting("--speculative-ngram-max-bfs-breadth",
                                                             tried=(1, 4, NGRAM_DEFAULT_BREADTH))},
                  rules=(ngram_rules,))

ALGORITHMS = {a.name: a for a in (AR, DFLASH, DDTREE, MTP, EAGLE3, NGRAM)}


def modes() -> tuple[str, ...]:
    """The bench's modes, one per algorithm, in the table's order (its default)."""
    return tuple(a.mode for a in ALGORITHMS.values())


def drafting() -> tuple[str, ...]:
    """The algorithms a profile may name: those that draft."""
    return tuple(name for name, a in ALGORITHMS.items() if a.drafts)


def settings() -> dict[str, Setting]:
    """Every algorithm's optional settings, in the table's order: what a profile's `speculative` may hold."""
    return {key: s for a in ALGORITHMS.values() for key, s in a.settings.items()}


def autoregressive() -> "Speculative":
    """What a profile without `speculative` serves: AR, one token a target pass."""
    return Speculative(AR.name, 1)


def of_mode(mode: str) -> Algorithm:
    """The algorithm the bench serves as `mode` ("ar", "dflash", ...)."""
    return next(a for a in ALGORITHMS.values() if a.mode == mode)


@dataclass(frozen=True)
class Speculative:
    """A profile's speculative decoding settings (group_data/all.py `profiles[...]['speculative']`)."""

    algorithm: str  # a key of ALGORITHMS
    num_draft_tokens: int
    values: dict[str, int] = field(default_factory=dict)  # its optional settings that are set (settings())

    @property
    def entry(self) -> Algorithm:
        return ALGORITHMS[self.algorithm]

    @property
    def tree_size(self) -> int | None:
        """Its tree setting's value (DDTree's budget), None when unset or the algorithm has none."""
        return self.values.get(self.entry.tree) if self.entry.tree else None

    def flags(self, draft_model_dir: str | None, draft_backend: str) -> list[str]:
        """Its SGLang flags (the newest spellings; command_line.spell renders them for a version); `draft_model_dir`:
        the drafter's weights, None for an algorithm without a drafter."""
        if not self.entry.drafts:
            return []
        table = settings()
        drafter = ["--speculative-draft-model-path", draft_model_dir] if self.entry.drafter else []
        backend = ["--speculative-draft-attention-backend", draft_backend] if self.entry.draft_model else []
        return ["--speculative-algorithm", self.entry.sglang_name, *drafter,
                "--speculative-num-draft-tokens", str(self.num_draft_tokens), *backend,
                *(arg for key, s in table.items() if key in self.values for arg in (s.flag, str(self.values[key])))]

    def as_mode(self, mode: str) -> "Speculative":
        """What the bench serves as `mode` from these (deployed) settings: the same drafter and draft tokens,
        the mode's own settings kept, its tree setting at the spine default where unset (spine mode)."""
        entry = of_mode(mode)
        values = {key: self.values[key] for key in entry.settings if key in self.values}
        if entry.tree is not None and entry.tree not in values:
            values[entry.tree] = entry.spine(self.num_draft_tokens)
        return Speculative(entry.name, self.num_draft_tokens, values)
