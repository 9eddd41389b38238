"""What a deployment may be tuned to: the profiles of its target model (group_data/all.py `profiles`: another
algorithm, drafter or build of the same model), each algorithm they serve at the settings it tries
(deployment/server/speculative.py `Algorithm.tried`) at each layout of its GPUs, every one resolved as the
deploy resolves a tuned file naming that profile (hosts.resolve_worker's `tuned`), so that the profile,
the layout, the flags and the engine's rules that judge them are the deploy's own. A profile serves its own
algorithm, and those its drafter drafts for too (serving_benchmark/modes.py `shares_drafter`: DDTree's spine
is a DFlash drafter's chain) where no profile of the model names them itself; the user's `algorithms` (the
bench's modes) choose among them. The baseline is autoregressive decoding at the layout deployed: the
model's profile without speculation where it has one, else the deployed profile without its speculative
flags. Left out, each with its reason: a layout the GPUs do not divide into (deployment/server/layout.py),
flags the algorithm's rules refuse (flags.rendered_violations), a build without the algorithm
(checks.lacks_algorithm), a profile whose drafter the deployment does not hold (the tuner fetches no
weights) and, where the hub's snapshots are given, weights or a KV cache that do not fit
(checks.memory_problems, checks.kv_capacity). The host's own SGLang judges a candidate again before its
trial starts (sandbox.rejection)."""

from dataclasses import dataclass, replace
from typing import Any

from deployment import hosts, site_data
from deployment.gpu.config import GpuExpectations
from deployment.hosts import Deployment
from deployment.knobs import BadHostData
from deployment.server import speculative
from deployment.server.command_line import rendered_violations
from operations.server import checks
from serving_benchmark import modes


@dataclass(frozen=True)
class Candidate:
    """One setting a tuner may measure: its tuned-file settings and the deployment they make. The baseline
    (autoregressive decoding, no speculative flag) has no settings of a tuned file: it is what each
    candidate's speedup is over, at the layout deployed."""

    settings: dict
    deployment: Deployment

    @property
    def baseline(self) -> bool:
        return not self.deployment.engine.speculative.entry.drafts

    @property
    def label(self) -> str:
        """The candidate in a few words: algorithm, draft tokens, its settings, TP x replicas, and the profile
        where it is not the deployment's own."""
        spec, engine = self.deployment.engine.speculative, self.deployment.engine
        values = "".join(f" {key}={value}" for key, value in spec.values.items() if key in spec.entry.settings)
        drafting = f" n={spec.num_draft_tokens}{values}" if spec.entry.drafts else ""
        profile = f" ({engine.profile_name})" if engine.profile_name != self.deployment.name else ""
        return f"{spec.algorithm}{drafting} TP{engine.tp_size}x{len(self.deployment.replicas)}{profile}"

    @property
    def algorithm(self) -> str:
        return self.deployment.engine.speculative.algorithm

    @property
    def kind(self) -> tuple:
        """What it shares with the candidates of one axis: its profile, its algorithm, and whether it verifies
        a tree."""
        spec = self.deployment.engine.speculative
        return (self.deployment.engine.profile_name, spec.algorithm,
                spec.entry.builds_tree(spec.num_draft_tokens, spec.tree_size))

    @property
    def shape(self) -> tuple[int, int]:
        """Its layout: TP size and replicas."""
        return (self.deployment.engine.tp_size, len(self.deployment.replicas))

    @property
    def axis(self) -> tuple[int, ...]:
        """Where it lies on its family's axis: draft tokens, then the tree setting."""
        spec = self.deployment.engine.speculative
        return (spec.num_draft_tokens, spec.tree_size or 0)


def _of(data: Any, host_class: str, name: str, settings: dict | None, profile: str) -> Deployment:
    _, found = hosts.resolve_worker(data, host_class, tuned=None if settings is None else {profile: settings})
    return next(d for d in found if d.name == name)


def entry_profile(data: Any, host_class: str, name: str) -> str:
    """The profile the host's data names for its deployment `name` (which its tuned file is kept under,
    whatever profile that file serves)."""
    entries = hosts.entries(site_data.class_data(data, host_class))
    return next(e["profile"] for e in entries if e.get("name", e["profile"]) == name)


def _layouts(d: Deployment) -> list[dict]:
    """The layouts a tuner may try of a deployment's GPUs: each TP size up to their count (the layout's own
    rules refuse those that do not divide them), with the replicas that fill them, whatever another profile's
    class layout says; a node group's server keeps its one layout."""
    if d.node_group is not None:
        return [{}]
    count = len(d.engine.layout.gpus)
    return [{"tp_size": tp, **({"replicas": count // tp} if count % tp == 0 else {})} for tp in range(1, count + 1)]


def _served(profiles: dict[str, dict], allowed: tuple[str, ...] | None) -> list[tuple[str, speculative.Algorithm]]:
    """(profile, algorithm) for each drafting algorithm the model's `profiles` serve, in their order: each
    profile's own algorithm, and where no profile names one, each other that its drafter drafts for
    (`modes.shares_drafter`); only the modes `allowed` (None: all)."""
    own = [(p, speculative.ALGORITHMS[v["speculative"]["algorithm"]]) for p, v in profiles.items()
           if v.get("speculative") is not None]
    named = {entry.name for _, entry in own}
    extra = {}
    for p, entry in own:
        for other in speculative.ALGORITHMS.values():
            if entry.drafter and other.drafts and other.drafter and other.name not in named \
                    and modes.shares_drafter(other, entry):
                extra.setdefault(other.name, (p, other))
    order = list(profiles), list(speculative.ALGORITHMS)  # by profile, then in the table's order
    return sorted(((p, entry) for p, entry in [*own, *extra.values()] if allowed is None or entry.mode in allowed),
                  key=lambda pair: (order[0].index(pair[0]), order[1].index(pair[1].name)))


def candidates(data: Any, host_class: str, name: str, expected: GpuExpectations | None = None,
               snapshots: dict | None = None, gpus: list | None = None,
               algorithms: tuple[str, ...] | None = None) -> tuple[list[Candidate], list[str]]:
    """The candidates of the deployment `name` of a host (its data, of `host_class`), the baseline first, and
    a line for each one left out; `algorithms`: the modes to compare (None: every one the model's profiles
    serve); `snapshots` (the hub's, per role, of what the deployment holds), `gpus` (the host's) and
    `expected` (the class's) add the KV plan's and the weights' checks of each layout."""
    own_profile = entry_profile(data, host_class, name)
    deployed = _of(data, host_class, name, None, own_profile)
    profiles = site_data.class_data(data, host_class).profiles
    model = profiles[own_profile]["target"]["repo"]
    # The model's profiles, the deployment's own first.
    of_model = {p: v for p, v in sorted(profiles.items(), key=lambda item: item[0] != own_profile)
                if isinstance(v, dict) and v.get("target", {}).get("repo") == model}
    shape = {"tp_size": deployed.engine.tp_size, "replicas": len(deployed.replicas)}
    baseline, left_out = _baseline(data, host_class, name, own_profile, of_model, deployed, shape, algorithms)
    layouts = []
    for layout in _layouts(deployed):
        try:
            _of(data, host_class, name, {"profile": deployed.engine.profile_name,
                                         **_settings(deployed.engine.speculative), **layout}, own_profile)
            layouts.append(layout)
        except BadHostData as refused:  # the layout itself: no setting of it resolves
            left_out.append(f"tp_size {layout.get('tp_size')}: {refused}")
    found, seen, skipped = [], [], set()
    served = _served(of_model, algorithms)
    for layout, (profile, entry) in ((layout, pair) for layout in layouts for pair in served):
        kept = of_model[profile]["speculative"]
        block = int(kept["num_draft_tokens"])  # the drafter's block size (a model's draft layers': its steps)
        for spec in entry.tried(block, kept):
            if (profile, entry.name) in skipped:
                break
            settings = {"profile": profile, **_settings(spec), **layout}
            backend = entry.target_backend(deployed.engine.attention_backend, spec.num_draft_tokens, spec.tree_size)
            if backend != deployed.engine.attention_backend:
                settings["attention_backend"] = backend
            try:
                candidate = Candidate(settings, _of(data, host_class, name, settings, own_profile))
                missing = _missing_drafter(candidate.deployment, deployed)
            except BadHostData as refused:  # another profile of the model, which this class cannot serve
                missing = str(refused)
            if missing:  # the same of every setting of the profile: said once
                left_out.append(f"{entry.name} ({profile}): {missing}")
                skipped.add((profile, entry.name))
                continue
            why = _left_out(candidate.deployment, expected, snapshots, gpus)
            # What it serves: a host's own layout makes every tried layout its one.
            serves = (candidate.kind, candidate.shape, candidate.deployment.engine.speculative,
                      candidate.deployment.engine.attention_backend)
            if why:
                left_out.append(f"{candidate.label}: {why}")
            elif serves not in seen:
                seen.append(serves)
                found.append(candidate)
    if not found:
        left_out.append(f"{own_profile}: no profile of {model} drafts with what this host holds (no speculative "
                        "settings to tune)")
    return [baseline, *found], left_out


def _missing_drafter(d: Deployment, deployed: Deployment) -> str | None:
    """Why the host cannot serve `d`: a drafter the deployed weights do not hold (the tuner fetches none)."""
    wanted, held = d.weights.drafter, deployed.weights.drafter
    if wanted is None or (held is not None and (held.repo_id, held.revision) == (wanted.repo_id, wanted.revision)):
        return None
    return (f"its drafter {wanted.repo_id} is not on the host, which serves {deployed.engine.profile_name}: deploy "
            f"{d.engine.profile_name} once (the deploy fetches it) and tune again")


def _baseline(data: Any, host_class: str, name: str, own_profile: str, of_model: dict, deployed: Deployment,
              shape: dict, algorithms: tuple[str, ...] | None) -> tuple[Candidate, list[str]]:
    """Autoregressive decoding at the layout deployed, what every speedup is over: the model's profile that
    drafts nothing where it has one (and the user's modes allow it), else the deployed one without its
    speculative flags."""
    plain = [p for p, v in of_model.items() if v.get("speculative") is None]
    ar = speculative.autoregressive()
    if plain and (algorithms is None or ar.entry.mode in algorithms):
        settings = {"profile": plain[0], **_settings(ar), **shape}
        try:
            return Candidate(settings, _of(data, host_class, name, settings, own_profile)), []
        except BadHostData as refused:
            left_out = [f"{ar.algorithm} ({plain[0]}): {refused}; the baseline is {deployed.engine.profile_name} "
                        "without its speculative flags"]
    else:
        left_out = []
    return Candidate({}, replace(deployed, engine=replace(deployed.engine, speculative=ar))), left_out


def _settings(spec: speculative.Speculative) -> dict:
    return {"algorithm": spec.algorithm, "num_draft_tokens": spec.num_draft_tokens, **spec.values}


def _left_out(d: Deployment, expected: GpuExpectations | None, snapshots: dict | None, gpus: list | None) -> str | None:
    """Why the deploy would refuse this candidate's deployment, in its words; None where it would serve it."""
    server = d.replicas[0]
    if checks.lacks_algorithm(d.engine):
        return f"{d.engine.sglang_requirement} is a release without {d.engine.speculative.entry.label}"
    violations = rendered_violations(server)
    if violations:
        return violations[0]
    if snapshots is None or expected is None:
        return None
    # The hub's snapshots of the repos it loads (another profile of the model may load no drafter).
    snapshots = {role: s for role, s in snapshots.items() if d.weights.repo(role) is not None}
    weight_bytes = sum(s.weight_bytes for s in snapshots.values())
    problems = checks.memory_problems(server, expected, d.engine.served_model_name, weight_bytes, gpus)
    if not problems:
        problems = checks.kv_capacity(server, expected, snapshots, gpus, d.host.min_kv_tokens)[0]
    return problems[0] if problems else None
