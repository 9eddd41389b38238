"""What must hold before the server is changed: the model fits the GPUs, the SGLang build has what the
profile asks (an algorithm in no release, such as DDTree) and accepts its speculative settings, its git ref is
a commit, an exposed server has a key; each failure one sentence."""

import re

from pyinfra import host

from deployment import network
from deployment.gpu.config import GpuExpectations
from deployment.knobs import COMMIT
from deployment.server import capacity
from deployment.server.command_line import rendered_violations, server_args, value
from deployment.server.config import Engine, Server, ServiceHost, git_refs
from operations.basics import gathering
from operations.basics.untrusted import printable
from operations.python.virtualenvs import VenvRequirement, fingerprint
from operations.server.sandbox import rejection

GIB = 1 << 30
# A release pin, which an algorithm of a pull request (speculative.Algorithm.pull_request) is not in.
RELEASE_PIN = re.compile(r"sglang\s*(==|~=|>=|<=|<|>|===)")


def _card_mib(server: Server, expected: GpuExpectations, gpus: list | None) -> int:
    """The smallest memory among the replica's GPUs as the host reports them, else the class's minimum."""
    found = {g.get("index"): g for g in gpus or []}
    mine = [found[i] for i in server.gpus if i in found]
    return min((g.get("memory_total_mib") or 0 for g in mine), default=expected.min_memory_mib)


def memory_problems(server: Server, expected: GpuExpectations, model: str, weight_bytes: int,
                    gpus: list | None) -> list[str]:
    """One replica's plan: its GPUs exist on the host, and the weights of `model` and its drafter per GPU at
    its TP size fit what each of its GPUs offers."""
    s = server
    found = {g.get("index"): g for g in gpus or []}
    if gpus and not set(s.gpus) <= set(found):
        return [f"{host.name}: {s.service_name} takes GPUs {', '.join(map(str, s.gpus))}, but the host has GPUs "
                f"{', '.join(str(i) for i in sorted(found))}: give it GPUs the host has (layouts or deployments)"]
    e = s.engine
    per_card_mib = _card_mib(s, expected, gpus)
    usable = per_card_mib * (1 << 20) * e.mem_fraction_static
    per_gpu = weight_bytes / e.tp_size
    if per_gpu <= usable:
        return []
    return [f"{host.name}: {model} and its drafter need {per_gpu / GIB:.1f} GiB of weights per GPU "
            f"at TP {e.tp_size} ({s.service_name}), but each GPU offers {usable / GIB:.1f} GiB (mem_fraction_static "
            f"{e.mem_fraction_static} of {per_card_mib} MiB): use a larger tp_size in its layout, a class with more "
            "GPU memory or a quantized checkpoint"]


def kv_plan(server: Server, expected: GpuExpectations, snapshots: dict, gpus: list | None) -> capacity.CapacityPlan:
    """One replica's KV cache as SGLang will size it (deployment/server/capacity.py), from the hub's
    config.json and weight sizes of its target and drafter (`snapshots`, per role) and its GPUs' memory;
    capacity.NoRule for an architecture the planner has no rule for."""
    s = server
    target, drafter = snapshots["target"], snapshots.get("drafter")
    drafting = drafter is not None and s.engine.speculative.entry.drafts
    return capacity.plan_server(
        s.service_name, server_args(s), card_bytes=_card_mib(s, expected, gpus) << 20, target_config=target.config,
        target_weight_bytes=target.weight_bytes, drafter_config=drafter.config if drafting else None,
        drafter_weight_bytes=drafter.weight_bytes if drafting else 0,
        draft_kv_of_target=s.engine.speculative.entry.draft_kv_of_target)


def kv_capacity(server: Server, expected: GpuExpectations, snapshots: dict, gpus: list | None,
                min_kv_tokens: int | None) -> tuple[list[str], str]:
    """One replica's KV plan (kv_plan) against its floor: (the refusal when it holds fewer than
    `min_kv_tokens` tokens, None meaning one full context of the model; what the plan says, for preflight's
    line). An architecture the planner has no rule for is said so, not refused; a context above the model's
    own is refused: the profiles let SGLang take one (SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN, for the
    drafter), and it would serve past what the model was trained for."""
    trained = snapshots["target"].text_config().get("max_position_embeddings")
    asked = value(server_args(server), "--context-length")
    if asked and asked.isdigit() and isinstance(trained, int) and int(asked) > trained:
        return [f"{host.name}: {server.service_name}: its --context-length {asked} is above the model's "
                f"max_position_embeddings {trained}: use at most {trained}"], "KV cache not planned"
    try:
        plan = kv_plan(server, expected, snapshots, gpus)
    except capacity.NoRule as unknown:
        return [], f"KV cache not planned ({printable(unknown)})"  # it names the hub's architecture
    context = asked or trained
    wanted = min_kv_tokens if min_kv_tokens is not None else int(context or 0)
    refused = capacity.refusal(plan, wanted, full_context=min_kv_tokens is None)
    return ([f"{host.name}: {refused}"] if refused else []), capacity.described(plan)


def refused_flags(server: Server, refused: str, units: list[str] | None = None) -> str:
    """The one sentence for flags the host's SGLang refuses (before a restart, or in preflight), naming
    the units left as they were (`units`: replicas refused alike; by default the server's own)."""
    e, units = server.engine, units or [server.service_name]
    a = e.speculative.entry
    fix = (f"point profiles['{e.profile_name}']['sglang']['requirement'] at a {a.label} build "
           f"(PR #{a.pull_request})" if a.pull_request else "fix the flag in group_data or the SGLang pin")
    left = f"{units[0]} was left as it was" if len(units) == 1 else f"{', '.join(units)} were left as they were"
    return f"{host.name}: the SGLang in {e.venv} rejects the rendered flags ({refused}); {fix}; {left}"


def lacks_algorithm(engine: Engine) -> bool:
    """Whether the engine's SGLang requirement is a release, which its algorithm of a pull request is not in."""
    return engine.speculative.entry.pull_request is not None and bool(RELEASE_PIN.match(engine.sglang_requirement))


def unreleased_problems(server: Server) -> list[str]:
    """An algorithm in no release (DDTree) needs an SGLang build that has it; an installed one of the
    wanted build must accept its flags."""
    s, e = server, server.engine
    a = e.speculative.entry
    if a.pull_request is None:
        return []
    if lacks_algorithm(e):
        return [f"{host.name}: profile {e.profile_name} uses {a.label}, but {e.sglang_requirement} is a release and "
                f"no SGLang release up to 0.5.23 has {a.label} (it is in open pull request #{a.pull_request}): set "
                f"profiles['{e.profile_name}']['sglang']['requirement'] to a build that has it, e.g. "
                f"'{a.build}' with the pull request's commit, or a wheel path/URL"]
    installed = gathering.read(VenvRequirement, path=e.venv, distribution="sglang")
    if not installed or installed["fingerprint"] != fingerprint(e.sglang_requirement, e.service.pip_index_url):
        return []  # not installed yet (no venv on a fresh host): the unit's validation checks it before any restart
    refused = rejection(host, s, server_args(s))
    return [refused_flags(s, refused)] if refused else []


def rule_problems(server: Server) -> list[str]:
    """The engine's refusals of the server's speculative settings, before anything is installed: its algorithm's
    rules (speculative.py: the release's own checks, in its words) over what the deploy renders, one sentence
    each. An algorithm of a pull request is judged by its build, once installed (unreleased_problems): its rules
    follow a branch that moves."""
    e = server.engine
    if e.speculative.entry.pull_request is not None:
        return []
    return [f"{host.name}: profile {e.profile_name}: SGLang {e.sglang_version} would refuse its "
            f"{e.speculative.algorithm} settings ({server.service_name}): {said}"
            for said in rendered_violations(server)]


def unpinned_build(engine: Engine) -> list[str]:
    """A sentence per git ref of the SGLang requirement that names a branch, tag or pull request, not a commit."""
    return [f"{engine.sglang_requirement}: {ref!r} is not a commit, so what is installed can change under the same "
            f"name: pin it with `python pin.py INVENTORY` (it runs `git ls-remote {url} {ref}` and writes the "
            "commit to SPECFLEET_SITE/pins.json), or set allow_branch_revisions=true"
            for url, ref in git_refs(engine.sglang_requirement) if not COMMIT.fullmatch(ref)]


def exposure_problems(service: ServiceHost, key_on_controller: bool, key_on_host: bool) -> list[str]:
    """The host's servers, reachable beyond loopback (its one `bind_address`), never run without an API key."""
    s = service
    keyed = key_on_controller or (key_on_host and not s.remove_api_key)
    if not s.exposed or (keyed and not s.remove_api_key):
        return []
    why = "remove_api_key is set" if s.remove_api_key else \
        f"${s.api_key_env} is not set on the controller and the host has no key"
    return [f"{host.name}: the servers would listen on {s.bind_address}, beyond loopback, without an API key "
            f"({why}): export {s.api_key_env} on the controller (the servers then require it), or "
            f"set bind_address={network.LOOPBACK} and reach them through a gateway on the host"]
