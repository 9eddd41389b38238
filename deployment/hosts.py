"""The deployments one host gets: every subject's configuration, resolved from the host's data at once.

`resolve_worker()` is the only reader of a worker's host data: every knob of every subject is parsed
and checked here (through each subject's own `resolve`, with deployment/knobs.py), before any
host is touched, each object built once at its level: what is true of the host (`Host`: users and
paths, GPU runtime, smoke test, token), of each deployment (`Deployment`: weights, node group, and
what its servers run, `Engine`) and of each replica (`Server`: its unit, GPUs and ports). Each
operation then receives the level it acts on. A host serves one deployment (its `profile` on all of
its GPUs) or several on disjoint GPUs (`deployments`); each is laid out in replicas
(deployment/server/layout.py). A value that cannot be deployed raises
BadHostData: one line naming the knob, the value and what is accepted.
"""

import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from deployment import knobs, schema, site_data, tuned as tuned_settings
from deployment.gpu import config as gpu_config
from deployment.gpu.config import GpuRuntime, SmokeTest
from deployment.knobs import BadHostData
from deployment.nodes import group as nodes
from deployment.nodes.group import NodeGroup
from deployment.server import config as server_config, layout, speculative
from deployment.server.config import Engine, Server, ServiceHost
from deployment.weights import config as weights_config
from deployment.weights.config import Weights

@dataclass(frozen=True)
class Host:
    """What is true of a worker host whatever it serves, built once (`resolve_worker`): its servers' users,
    paths and unit settings, its GPU runtime (driver, fabric manager, what its GPUs must be), its GPU
    smoke test and where the controller holds the HF token. Every deployment of the host holds this one."""

    service: ServiceHost  # users, install and config directories, the token's HF home, the unit prefix
    gpu: GpuRuntime  # driver, fabric, GPU checks
    # The GPU smoke test before SGLang starts: once per host, with the first deployment's build (the
    # host's `sglang-venv`) and the environment every deployment of the host runs with.
    smoke: SmokeTest
    hf_token_env: str  # the controller's variable holding the token (else its huggingface_hub token file)
    min_kv_tokens: int | None  # the fewest tokens a replica's KV cache must hold; None: one full context

    @property
    def host_class(self) -> str:
        return self.gpu.host_class


@dataclass(frozen=True)
class Deployment:
    """One model a worker host serves (a profile on GPUs of its own), as each subject's slice. A host
    serves one deployment, or several on disjoint GPUs (`deployments` in its data)."""

    host: Host  # what is true of the host, the same for each of its deployments
    name: str  # the deployment's name on its host (units, ports and venvs are told apart by it)
    weights: Weights  # the target's and drafter's weights
    engine: Engine  # what its SGLang servers run: model, build, speculative settings, layout
    node_group: NodeGroup | None  # a server spanning several hosts: this host's part
    allow_branch_revisions: bool  # deploy what a branch or git ref points at now, with a warning
    tuned: tuned_settings.Use | None = None  # its tuned file (SITE/tuned/...), applied or stale

    @property
    def replicas(self) -> tuple[Server, ...]:
        """Its SGLang units, one a replica (deployment/server/layout.py)."""
        return self.engine.replicas


# A deployment's name: a word of a unit name (letters, digits, _), short enough for the unit's.
DEPLOYMENT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_]{0,31}")


def resolve(data: Any, host_class: str, node_members: dict | None = None) -> Deployment:
    """The one deployment of a host serving one model (`resolve_host` for any host)."""
    found = resolve_host(data, host_class, node_members)
    if len(found) != 1:
        raise BadHostData(f"the host serves {len(found)} deployments ({', '.join(d.name for d in found)}): "
                          "read them with resolve_host")
    return found[0]


def entries(data: Any) -> list[dict]:
    """The host's deployments as its data says them (`deployments`, else its `profile` on all its GPUs)."""
    listed = getattr(data, "deployments", None)
    if listed is None:
        return [{"profile": data.profile}]
    if not isinstance(listed, (list, tuple)) or not listed or not all(isinstance(e, dict) for e in listed):
        raise knobs.refused("deployments", listed, "use a list of dict(profile=..., gpus=[...]) (or None: the "
                            "host's `profile` on all of its GPUs)")
    for entry in listed:
        if "profile" not in entry or set(entry) - set(layout.DEPLOYMENT_KEYS):
            raise BadHostData(f"deployments entry {entry!r} is not accepted: use dict(profile=...) with optionally "
                              f"{', '.join(k for k in layout.DEPLOYMENT_KEYS if k != 'profile')}")
    return [dict(entry) for entry in listed]


def resolve_host(data: Any, host_class: str, node_members: dict | None = None) -> tuple[Deployment, ...]:
    """The deployments of a host of `host_class` (`resolve_worker`'s)."""
    return resolve_worker(data, host_class, node_members)[1]


def resolve_worker(data: Any, host_class: str, node_members: dict | None = None,
                   tuned: dict[str, dict] | None = None) -> tuple[Host, tuple[Deployment, ...]]:
    """Resolve `host.data` (or any object with the same attributes) for a host of `host_class`: what is
    true of the host, once, and its deployments, checked each and together (names, GPUs, ports, one
    revision per repo, one environment); `node_members`: its node group's hosts (`nodes.members(inventory,
    host)`), if it is in one; `tuned`: per profile, settings to serve in place of its tuned file's (a
    tuner's candidate, tuning/candidates.py)."""
    data = site_data.class_data(data, host_class)
    listed = entries(data)
    if getattr(data, "node_group", None) is not None and getattr(data, "deployments", None) is not None:
        raise BadHostData("deployments and node_group are not accepted together: a host of a node group serves "
                          "its group's one server on all of its GPUs (remove one of them)")
    found: list[dict] = []  # each deployment's fields but its host's
    service, gpu, token_env, smoke = None, None, None, None
    for entry in listed:
        profile = entry["profile"]
        chosen = server_config.profile_named(data, profile)
        try:
            # What is true of the host, once: the first entry's lookup reports what is missing in its name.
            service = service or server_config.service_host(data)
            gpu = gpu or gpu_config.resolve(data, host_class)
            token_env = token_env or weights_config.token_env(data)
            found.append(_resolve(data, host_class, entry, chosen, node_members, service, gpu,
                                  token_env, several=len(listed) > 1,
                                  candidate=(tuned or {}).get(profile)))
            smoke = smoke or _smoke(data, gpu, service, found[0]["engine"])
            _same_environment(found[0], found[-1])
        except (KeyError, TypeError, AttributeError, IndexError) as error:
            raise BadHostData(f"group data for profile {profile!r} on class {host_class} is incomplete or "
                              f"malformed ({type(error).__name__}: {error}): compare it with group_data/all.py "
                              f"and group_data/{host_class}.py") from None
    worker = Host(service=service, gpu=gpu, smoke=smoke, hf_token_env=token_env,
                  min_kv_tokens=schema.value(data, "min_kv_tokens"))
    deployments = tuple(Deployment(host=worker, **fields) for fields in found)
    _together(deployments)
    _own_users(deployments, getattr(data, "gateway_user", None))
    return worker, deployments


def _smoke(data: Any, gpu: GpuRuntime, service: ServiceHost, engine: Engine) -> SmokeTest:
    """The host's GPU smoke test, with `engine`'s build and environment."""
    schema.refuse_retired(data, "gpu")
    return SmokeTest(expected=gpu.expected, venv=engine.venv, install_dir=service.install_dir, env=engine.env,
                     build=engine.sglang_requirement, user=service.service_user,
                     timeout_s=schema.value(data, "gpu_smoke_timeout_s"))


def _same_environment(first: dict, other: dict) -> None:
    """Deployments of one host run with one environment: the GPU smoke test, once per host, proves NCCL
    with it, and its P2P decision goes into every unit's (smoke.decided_env)."""
    mine, theirs = first["engine"].env, other["engine"].env
    if mine != theirs:
        differ = sorted(key for key in {*mine, *theirs} if mine.get(key) != theirs.get(key))
        raise BadHostData(f"deployments {first['name']} and {other['name']} run with different environments "
                          f"({', '.join(differ)}): the host's GPU smoke test runs once, with one; give their "
                          "profiles the same env")


def _together(found: tuple[Deployment, ...]) -> None:
    """Deployments of one host: names, GPUs and ports (HTTP and --nccl-port) each once; one revision of a repo."""
    seen_names, seen_gpus, seen_ports, revisions = set(), {}, {}, {}
    for d in found:
        if d.name in seen_names:
            raise BadHostData(f"deployments: two are named {d.name!r}: give each its own name (name=...)")
        seen_names.add(d.name)
        for replica in d.replicas:
            for gpu in replica.gpus:
                if gpu in seen_gpus:
                    raise BadHostData(f"deployments {seen_gpus[gpu]} and {d.name} both take GPU {gpu}: give each "
                                      "deployment GPUs of its own (gpus=[...])")
                seen_gpus[gpu] = d.name
            for port, use in ((replica.port, "HTTP port"), (replica.nccl_port, "--nccl-port")):
                if port in seen_ports:
                    raise BadHostData(f"{seen_ports[port]} and {replica.service_name}'s {use} are both port {port}: "
                                      "give one of them another (port, a deployment's port=..., or nccl_port)")
                seen_ports[port] = f"{replica.service_name}'s {use}"
        for repo in d.weights.repos:
            other = revisions.setdefault(repo.repo_dir, (d.name, repo.revision))
            if other[1] != repo.revision:
                raise BadHostData(f"deployments {other[0]} and {d.name} pin {repo.repo_id} at {other[1]} and "
                                  f"{repo.revision}: a host holds one revision of a repo for its deployments")


def shared_account(user: str, others: dict[str, str | None]) -> str | None:
    """Which of `others` (what an account holds -> its name) `user` is, where `user` runs a model's code
    (a deployment's servers): that code would then hold it too (the download user's token, the build
    user's builds, the gateway's keys), and ``account_problem`` passes such an account, a system user the
    deploy made; None when `user` is none of them.

    **Example:** ``shared_account("sglang-download", {"the download user": "sglang-download"})`` is
    ``"the download user"``.
    """
    return next((held for held, other in others.items() if other == user), None)


def _own_users(found: tuple[Deployment, ...], gateway_user: str | None) -> None:
    """Each deployment's user (the service user, or SERVICE_USER-NAME on a host of several) is none of the
    host's accounts that hold what its model's code must not reach (``shared_account``): a
    deployment named `download` would otherwise run as the download user, the token's owner."""
    held = {"the download user (the HF token's owner)": found[0].engine.service.download_user if found else None,
            "the build user (it builds git requirements)": server_config.BUILD_USER,
            "the gateway's user (it reads the gateway's keys)": gateway_user}
    for d in found:
        taken = shared_account(d.engine.user, held)
        if taken:
            where, value = (f"deployments[{d.name!r}]['name']", d.name) if d.engine.own_user \
                else ("service_user", d.engine.user)
            raise knobs.refused(where, value, "the servers run the model's code, which would hold what that user "
                                "holds: use another name", wrong=f"makes the servers' user {d.engine.user}, {taken}")


def _tuned(profile_name: str, data: Any, candidate: dict | None,
           own: dict) -> tuple[tuned_settings.Tuned | None, tuned_settings.Use | None]:
    """What a deployment of `profile_name` takes of its tuned settings: `candidate` where a tuner tries one
    (applied), else its tuned file where the site holds one, whose staleness its served profile's build and
    drafter decide (`_served`)."""
    if candidate is not None:
        checked = tuned_settings.settings(Path("(candidate)"), candidate)
        return None, tuned_settings.Use(None, checked, None, tuned_settings.sources(checked, own))
    found = tuned_settings.read(getattr(data, "tuned", None), profile_name)
    return found, None


def _served(data: Any, profile_name: str, profile: dict, settings: dict, where: str) -> tuple[str, dict]:
    """The profile that tuned `settings` serve in place of `profile_name`'s: the one they name, which must be
    a profile of the same target model (BadHostData naming `where` otherwise), else its own."""
    name = settings.get("profile", profile_name)
    other = profile if name == profile_name else server_config.profile_named(data, name)
    if other.get("target", {}).get("repo") != profile.get("target", {}).get("repo"):
        raise BadHostData(f"{where}: settings['profile'] {name!r} serves {other.get('target', {}).get('repo')}, "
                          f"not {profile_name}'s {profile.get('target', {}).get('repo')}: fix it, or run tune.py "
                          "again to write it anew")
    algorithm = settings.get("algorithm")
    if algorithm is not None and not speculative.ALGORITHMS[algorithm].drafts and "drafter" in other:
        raise BadHostData(f"{where}: settings['algorithm'] {algorithm!r} drafts nothing, but profile {name!r} names "
                          "a drafter: name a profile of the model without one, or run tune.py again")
    return name, other


def _resolve(data: Any, host_class: str, entry: dict, profile: dict, node_members: dict | None,
             service: ServiceHost, gpu: GpuRuntime, token_env: str, several: bool,
             candidate: dict | None = None) -> dict:
    """A deployment's fields but its host's."""
    entry_profile = entry["profile"]
    name = knobs.matching("deployment name", entry.get("name", entry_profile), DEPLOYMENT_NAME,
                          "letters, digits and _ (at most 32)")
    weights_dir = schema.value(data, "weights_dir")

    def weights_of(profile_name: str, profile: dict):
        return weights_config.resolve(data, profile_name, profile, weights_dir, token_env, owner=service.download_user,
                                      reader=service.service_user, hf_home=service.hf_home,
                                      earlier_token_file=service.earlier_token_file, config_dir=service.config_dir,
                                      install_dir=service.install_dir)
    own = {k: v for k, v in entry.items() if k in layout.KEYS}
    named = {k: v for k, v in own.items() if v is not None}
    found, use = _tuned(entry_profile, data, candidate, named)
    tuned_values = use.settings if use is not None else found.settings if found is not None else {}
    profile_name, served = _served(data, entry_profile, profile, tuned_values,
                                   str(found.path) if found is not None else "(candidate)")
    weights = weights_of(profile_name, served)
    if found is not None:
        # A tuned file applies where its served profile's build and drafter are what it was measured with;
        # stale, the deployment serves its own profile with its defaults.
        build = server_config.sglang_build(server_config.sglang_requirement(data, profile_name, served))
        use = tuned_settings.Use(found.path, found.settings,
                                 tuned_settings.stale(found, tuned_settings.deployed_with(build, weights.drafter)),
                                 tuned_settings.sources(found.settings, named))
        if not use.applied and profile_name != entry_profile:
            profile_name, served = entry_profile, profile
            weights = weights_of(profile_name, served)
    profile = served
    port, nccl_port = server_config.ports(data)
    count = gpu.expected.count
    group = nodes.group(data, host_class, profile_name, count, port, node_members)
    values = layout.class_default(data, host_class, profile_name, count)
    if use is not None and use.applied:
        profile, values = tuned_settings.over(profile, values, use.settings, named)
    if group is not None:
        # One server over the group's nodes: TP over all their GPUs, this node's share of them, the
        # network between them named.
        per_node = group.tp_size // group.nnodes
        groups = (tuple(range(per_node)),)
        plan = layout.Layout(tp_size=group.tp_size, groups=groups, ports=(port,),
                             nccl_ports=layout.nccl_ports(groups, nccl_port))
        if plan.nccl_ports[0] in range(group.dist_init_port, group.dist_init_port + 7):
            raise knobs.refused(f"node_groups[{group.name!r}]['dist_init_port']", group.dist_init_port,
                                "pick another, or another nccl_port",
                                wrong=f"collides with the server's --nccl-port {plan.nccl_ports[0]} (SGLang uses the "
                                      "dist-init port and the 6 after it)")
    else:
        where = f"deployments[{name!r}]" if getattr(data, "deployments", None) is not None \
            else f"group_data/{host_class}.py layouts[{profile_name!r}]"
        values = {**values, **own}
        own_port = knobs.integer(f"deployments[{name!r}]['port']", entry["port"], minimum=1, maximum=65535) \
            if entry.get("port") is not None else None
        plan = layout.resolve(where, values, count, port, nccl_port, own_port)
    engine = server_config.engine(data, service, host_class, profile_name, profile, name,
                                  weights.local_dirs, plan, group,
                                  after_fabric_manager=gpu.expected.fabric_manager,
                                  user=server_config.deployment_user(service, name, several))
    return dict(name=name, weights=weights, engine=engine, node_group=group, tuned=use,
                allow_branch_revisions=schema.value(data, "allow_branch_revisions"))


def at_commits(deployment: Deployment, commits: dict[str, str]) -> Deployment:
    """The deployment at the commits the hub resolved its revisions to (per role): its weights in those
    revisions' directories, its engine (and through it every replica) loading from them. A role the hub
    did not answer stays as it was."""
    weights = deployment.weights.at_commits(commits)
    model_dir, draft_model_dir = weights.local_dirs
    return replace(deployment, weights=weights, engine=replace(
        deployment.engine, model_dir=model_dir, draft_model_dir=draft_model_dir))


def host_class_of(group_names) -> str:
    """The one class group (group_data/<class>.py, site_data.host_classes) an inventory puts a host in."""
    known = site_data.host_classes()
    classes = sorted({name for name in group_names if name in known})
    if len(classes) != 1:
        groups = ", ".join(sorted({name for name in group_names if name != "all"})) or "none but all"
        raise BadHostData(f"the host is in {' and '.join(classes) if classes else 'no'} class group"
                          f"{'s' if len(classes) > 1 else ''} (its groups: {groups}): put it in exactly one of "
                          f"the inventory groups {', '.join(known)}, or in `gateway` alone for a "
                          "gateway without GPUs")
    return classes[0]
