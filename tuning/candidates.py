"""What a deployment may be tuned to: each speculative algorithm's tried settings (deployment/server/speculative.py
`Algorithm.tried`) at each layout of its GPUs, every one resolved as the deploy resolves a tuned file
(deployment.hosts.resolve_worker's `tuned`), so that the layout, the flags and the engine's rules that judge them
are the deploy's own: a layout the GPUs do not divide into (deployment/server/layout.py), flags the
algorithm's rules refuse (command_line.rendered_violations), a build without the algorithm (checks.lacks_algorithm)
and, where the hub's snapshots are given, weights or a KV cache that do not fit (checks.memory_problems,
checks.kv_capacity) are left out, each with its reason. The host's own SGLang judges a candidate again
before its trial starts (sandbox.rejection)."""

from dataclasses import dataclass, replace
from typing import Any

from deployment import hosts
from deployment.gpu.config import GpuExpectations
from deployment.hosts import Deployment
from deployment.knobs import BadHostData
from deployment.server import speculative
from deployment.server.command_line import rendered_violations
from operations.server import checks
from serving_benchmark.modes import shares_drafter


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
        """The candidate in a few words: algorithm, draft tokens, its settings, TP x replicas."""
        spec = self.deployment.engine.speculative
        values = "".join(f" {key}={value}" for key, value in spec.values.items() if key in spec.entry.settings)
        drafting = f" n={spec.num_draft_tokens}{values}" if spec.entry.drafts else ""
        return f"{spec.algorithm}{drafting} TP{self.deployment.engine.tp_size}x{len(self.deployment.replicas)}"

    @property
    def kind(self) -> tuple:
        """What it shares with the candidates of one axis: its algorithm, and whether it verifies a tree."""
        spec = self.deployment.engine.speculative
        return (spec.algorithm, spec.entry.builds_tree(spec.num_draft_tokens, spec.tree_size))

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


def _layouts(d: Deployment) -> list[dict]:
    """The layouts a tuner may try of a deployment's GPUs: each TP size up to their count (the layout's own
    rules refuse those that do not divide them); a node group's server keeps its one layout."""
    if d.node_group is not None:
        return [{}]
    return [{"tp_size": tp} for tp in range(1, len(d.engine.layout.gpus) + 1)]


def candidates(data: Any, host_class: str, name: str, expected: GpuExpectations | None = None,
               snapshots: dict | None = None, gpus: list | None = None) -> tuple[list[Candidate], list[str]]:
    """The candidates of the deployment `name` of a host (its data, of `host_class`), the baseline first, and
    a line for each one left out; `snapshots` (the hub's, per role), `gpus` (the host's) and `expected` (the
    class's) add the KV plan's and the weights' checks of each layout."""
    deployed = _of(data, host_class, name, None, "")
    profile = deployed.engine.profile_name
    own = data.profiles[profile].get("speculative")
    ar = speculative.autoregressive()
    baseline = Candidate({}, replace(deployed, engine=replace(deployed.engine, speculative=ar)))
    if own is None:  # an autoregressive profile: no speculative setting to measure against its baseline
        return [baseline], [f"{profile}: the profile drafts nothing (no speculative settings to tune)"]
    block = int(own["num_draft_tokens"])  # the drafter's block size, whatever a tuned file serves
    # The algorithms its profile can serve: its own, and those its drafter drafts for too (DFlash's serves DDTree).
    mine = speculative.ALGORITHMS[own["algorithm"]]
    served = [a for a in speculative.ALGORITHMS.values() if a.drafts and (a is mine or (
        a.drafter and mine.drafter and shares_drafter(a, mine)))]
    found, left_out, seen = [], [], []
    for shape in _layouts(deployed):
        try:
            _of(data, host_class, name, {**_settings(deployed.engine.speculative), **shape}, profile)
        except BadHostData as refused:  # the layout itself: no setting of it resolves
            left_out.append(f"tp_size {shape['tp_size']}: {refused}")
            continue
        for entry in served:
            for spec in entry.tried(block, own):
                settings = {**_settings(spec), **shape}
                backend = entry.target_backend(deployed.engine.attention_backend, spec.num_draft_tokens,
                                               spec.tree_size)
                if backend != deployed.engine.attention_backend:
                    settings["attention_backend"] = backend
                candidate = Candidate(settings, _of(data, host_class, name, settings, profile))
                why = _left_out(candidate.deployment, expected, snapshots, gpus)
                # What it serves: a host's own layout makes every tried layout its one.
                serves = (candidate.shape, candidate.deployment.engine.speculative,
                          candidate.deployment.engine.attention_backend)
                if why:
                    left_out.append(f"{candidate.label}: {why}")
                elif serves not in seen:
                    seen.append(serves)
                    found.append(candidate)
    return [baseline, *found], left_out


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
    weight_bytes = sum(s.weight_bytes for s in snapshots.values())
    problems = checks.memory_problems(server, expected, d.engine.served_model_name, weight_bytes, gpus)
    if not problems:
        problems = checks.kv_capacity(server, expected, snapshots, gpus, d.host.min_kv_tokens)[0]
    return problems[0] if problems else None
