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

    name: str  # SGLang's --speculative-algorithm; the bench's mode is its lower case
    drafts: bool = True  # False: autoregressive, no speculative flag at all
    # Whether it drafts with a separate drafter repo (--speculative-draft-model-path), which its profile
    # names, its host fetches and its tuned file is measured with; False: AR, or a model's own draft layers.
    drafter: bool = True
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


AR = Algorithm("AR", drafts=False, drafter=False)
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

ALGORITHMS = {a.name: a for a in (AR, DFLASH, DDTREE)}


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
        return ["--speculative-algorithm", self.algorithm, *drafter,
                "--speculative-num-draft-tokens", str(self.num_draft_tokens),
                "--speculative-draft-attention-backend", draft_backend,
                *(arg for key, s in table.items() if key in self.values for arg in (s.flag, str(self.values[key])))]

    def as_mode(self, mode: str) -> "Speculative":
        """What the bench serves as `mode` from these (deployed) settings: the same drafter and draft tokens,
        the mode's own settings kept, its tree setting at the spine default where unset (spine mode)."""
        entry = of_mode(mode)
        values = {key: self.values[key] for key in entry.settings if key in self.values}
        if entry.tree is not None and entry.tree not in values:
            values[entry.tree] = entry.spine(self.num_draft_tokens)
        return Speculative(entry.name, self.num_draft_tokens, values)
