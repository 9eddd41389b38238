"""The SGLang servers one host runs, one object a level, each built once: what every server of the host
shares (`ServiceHost`: users, paths, network, keys), what every replica of a deployment runs (`Engine`:
its profile's model and speculative settings, its class's tuning, its layout, deployment/server/layout.py)
and each replica (`Server`: its unit's name, GPUs and ports, and its deployment's `Engine`); typed, checked."""

import difflib
import functools
import re
from dataclasses import dataclass
from typing import Any

from deployment import knobs, network, schema
from deployment.nodes.group import NodeGroup
from deployment.python.pinned import fingerprint
from deployment.server.layout import Layout, unit_name
from deployment.server.speculative import Speculative, autoregressive, drafting, settings

# What SGLang 0.5.23 takes to end once nothing is in flight after SIGTERM: up to 5 s to notice it
# (its drain loop polls every 5 s), one more 5 s poll, up to 15 s for the schedulers to leave after
# ShutdownReq (tokenizer_manager.py _SCHEDULER_EXIT_TIMEOUT_SECS), then killing and reaping its children.
SHUTDOWN_S = 30

# A server alone on loopback keeps the listeners of NCCL's bootstrap and of Gloo (each scheduler's CPU
# group) there too: each otherwise takes an interface of its own choosing (NCCL: the first that is not
# lo or docker*, NCCL's environment documentation; Gloo: the host name's address, measured with torch
# 2.14.1). One node needs no other (NCCL moves its data over P2P or shared memory within a host).
LOOPBACK_SOCKETS = {"NCCL_SOCKET_IFNAME": "lo", "GLOO_SOCKET_IFNAME": "lo"}

# 'name @ git+URL@REF#...': the repository URL and its ref. The ref follows the last @ past the URL's host
# (ssh://USER@HOST/PATH@REF, or scp-style USER@HOST:PATH@REF): an @ before the path is the URL's user,
# as pip's own split of a VCS URL reads it (pip/_internal/vcs/versioncontrol.py get_url_rev_and_auth).
GIT_REF = re.compile(r"git\+((?:[A-Za-z][\w+.-]*://[^/\s#]*/|[^/\s#@:]+@[^/\s#:]+:)[^#\s]*)@([^@#\s]+)")


# The options the deploy sets itself, each with the knob that sets it: what command_line.server_args renders
# (every spelling SGLang 0.5.23 accepts, command_line.RENAMED_FLAGS' old ones too), a node group's part
# (nodes.group) and the launcher's --api-key. Extra arguments may not repeat them: argparse takes
# the last, so an extra --host 0.0.0.0 would win over bind_address, past the exposure check.
DEPLOY_FLAGS = {
    "--model-path": "the profile's target", "--model": "the profile's target",
    "--served-model-name": "the profile's served_model_name",
    "--host": "bind_address", "--port": "port", "--nccl-port": "nccl_port",
    "--tp-size": "layouts tp_size", "--tensor-parallel-size": "layouts tp_size",
    "--mem-fraction-static": "sglang_tuning mem_fraction_static",
    "--attention-backend": "the profile's attention (sglang_tuning attention_backends)",
    "--speculative-algorithm": "the profile's speculative algorithm",
    "--speculative-draft-model-path": "the profile's drafter", "--speculative-draft-model": "the profile's drafter",
    "--speculative-num-draft-tokens": "the profile's speculative num_draft_tokens",
    "--speculative-draft-attention-backend": "the profile's attention (sglang_tuning attention_backends)",
    **{s.flag: f"the profile's speculative {key}" for key, s in settings().items()},
    "--speculative-dflash-draft-window-size": "the profile's speculative draft_window_size",
    "--enable-metrics": "enable_metrics",
    "--nnodes": "node_groups", "--node-rank": "node_rank", "--dist-init-addr": "node_groups dist_init_port",
    "--nccl-init-addr": "node_groups dist_init_port",
    "--api-key": "api_key_env (the key travels in a file, never in argv)",
    "--admin-api-key": "the worker admin key (generated on the host, never in argv)",
}


def deploy_flags(plan: Layout, profile_name: str) -> dict[str, str]:
    """DEPLOY_FLAGS, and --context-length where the layout sets it (its KV cache holds less than one full
    context of the model): the options no extra argument of this deployment may repeat."""
    if plan.context_length is None:
        return DEPLOY_FLAGS
    return {**DEPLOY_FLAGS, "--context-length": f"layouts[{profile_name!r}]['context_length']"}


BUILD_USER = "specfleet-build"  # builds git requirements (operations/python/virtualenvs.py ``git_build``)


def home_of(user: str) -> str:
    """The home the deploy gives each system user it makes; an existing account is taken only with this home
    (ownership.account_problem)."""
    return f"/home/{user}"


@dataclass(frozen=True)
class ServiceHost:
    """What every SGLang server of a host shares, whichever its deployment: who runs and owns what, and
    where (the service user runs the servers, the download user owns the HF token and the weights,
    deployment/weights/config.py Weights.owner; root's directories hold the programs and the keys), how
    the servers are reached and keyed, their package index, their units' prefix and how long a request
    in flight may take."""

    service_user: str
    download_user: str
    install_dir: str
    config_dir: str
    service_prefix: str  # the `service_name` knob
    longest_generation_s: int  # the longest a request may run: how long a stop or a drain waits for those in flight
    api_key_env: str  # the controller's variable holding the clients' API key
    remove_api_key: bool  # only this removes a key from a host; the servers must then bind to loopback
    pip_index_url: str | None  # the host's package index (uv, every SGLang build)
    bind_address: str  # where every server of the host listens
    weights_fanout_port: int  # the weights' peer server's (operations/weights/peer.py): no server binds it
    ip_allow: tuple[str, ...]  # networks its units admit beyond loopback, node group and gateways (`server_ip_allow`)
    enable_metrics: bool
    ready_timeout_s: int | None  # None: from the weights' size (readiness.ready_timeout)

    @property
    def stop_timeout_s(self) -> int:
        """A unit's TimeoutStopSec: the longest generation, then SGLang's own shutdown."""
        return self.longest_generation_s + SHUTDOWN_S

    @property
    def exposed(self) -> bool:
        """The servers are reachable beyond the host itself."""
        return not network.is_loopback(self.bind_address)

    @property
    def service_home(self) -> str:
        return home_of(self.service_user)

    @property
    def download_home(self) -> str:
        """The download user's home: no process of the service user reaches it."""
        return home_of(self.download_user)

    @property
    def hf_home(self) -> str:
        """The download user's Hugging Face home, where the token lives (the weights' downloads read it)."""
        return f"{self.download_home}/.cache/huggingface"

    @property
    def earlier_token_file(self) -> str:
        """Where deployments without a download user kept the token (the service user's HF_HOME): the
        deploy removes it."""
        return f"{self.service_home}/.cache/huggingface/token"

    @property
    def api_key_file(self) -> str:
        return f"{self.config_dir}/api-key"

    @property
    def admin_key_file(self) -> str:
        """The worker admin key (SGLang --admin-api-key) of a host that serves one deployment (``Engine``'s):
        generated on the host, never the clients'."""
        return f"{self.config_dir}/admin-api-key"


@dataclass(frozen=True)
class Engine:
    """What every SGLang server (replica) of one deployment runs, built once per deployment (`engine`):
    its profile's model and drafter (their weights directories, at the deployment's revisions), SGLang
    build, speculative settings, its class's tuning, environment and layout, and its host's `ServiceHost`.
    Its replicas are one a slot of its layout."""

    service: ServiceHost  # what every server of the host shares
    name: str  # the deployment's name on its host (units and venvs are told apart by it)
    user: str  # who its servers and whatever imports its model's code run as (`deployment_user`)
    profile_name: str
    host_class: str
    served_model_name: str
    model_dir: str  # the target's weights directory
    draft_model_dir: str | None  # the drafter's; None: its algorithm drafts without one (AR among them)
    sglang_requirement: str
    sglang_version: str
    venv_name: str  # its SGLang virtualenv, under install_dir (one per SGLang build: `venv_name`)
    speculative: Speculative
    attention_backend: str
    draft_attention_backend: str
    mem_fraction_static: float
    extra_args: tuple[str, ...]
    env: dict[str, str]
    layout: Layout  # its replicas' GPUs, ports and TP size (a node group's is over all its nodes)
    after_fabric_manager: bool  # NVSwitch boards: CUDA needs fabric manager first
    node_args: tuple[str, ...]  # a node group's part (operations/nodes)
    # Whether the main process holds requests to finish on a stop: a server alone, or a node group's
    # rank 0 (NodeGroup.serves_http); a rank >= 1 serves only SGLang's dummy health server.
    drains_on_stop: bool

    @property
    def tp_size(self) -> int:
        return self.layout.tp_size

    @property
    def venv(self) -> str:
        return f"{self.service.install_dir}/{self.venv_name}"

    @property
    def own_user(self) -> bool:
        """Whether its servers run as a user of its own (a host of several deployments: deployment_user),
        not as the host's service user."""
        return self.user != self.service.service_user

    @property
    def admin_key_file(self) -> str:
        """Its servers' worker admin key (SGLang --admin-api-key), which its user's own group alone reads
        (api_key.admin_key): the host's where it serves this deployment alone, one of its own where it serves
        several, so that no deployment's model code holds the key to another's admin routes."""
        return f"{self.service.admin_key_file}-{self.name}" if self.own_user else self.service.admin_key_file

    @property
    def home(self) -> str:
        """Its user's home, whose `.cache` alone its servers write (what Triton, torch and CUDA compile)."""
        return home_of(self.user)

    @property
    def server_hf_home(self) -> str:
        """Its servers' own HF_HOME (transformers' cache of a model's remote code), apart from the
        token's (ServiceHost.hf_home), which the units make inaccessible to the servers."""
        return f"{self.home}/.cache/sglang-huggingface"

    @functools.cached_property
    def replicas(self) -> tuple["Server", ...]:
        """Its SGLang units, one a slot of its layout, built once (a frozen dataclass's cached value is
        set on the instance, past its __setattr__)."""
        plan = self.layout
        return tuple(Server(engine=self, service_name=unit_name(self.service.service_prefix, self.name, gpus),
                            gpus=gpus, port=port, nccl_port=nccl_port)
                     for gpus, port, nccl_port in zip(plan.groups, plan.ports, plan.nccl_ports))


@dataclass(frozen=True)
class Server:
    """One SGLang unit (one replica of a deployment): its own unit name, GPUs and ports, and the deployment
    it serves (`engine`, through which its host's `ServiceHost`)."""

    engine: Engine  # what every replica of its deployment shares
    service_name: str  # this replica's unit (layout.unit_name)
    gpus: tuple[int, ...]  # this replica's GPUs (nvidia-smi indices)
    port: int
    nccl_port: int  # its TCPStore's (--nccl-port; layout.nccl_ports)

    @property
    def gpu_env(self) -> dict[str, str]:
        """The replica's GPUs as CUDA numbers them: by PCI bus, as nvidia-smi's indices (CUDA's own default
        order is fastest first: CUDA C Programming Guide, "CUDA Environment Variables")."""
        return {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": ",".join(map(str, self.gpus))}

    @property
    def env_file(self) -> str:
        return f"{self.engine.service.config_dir}/{self.service_name}.env"

    @property
    def unit_file(self) -> str:
        return f"/etc/systemd/system/{self.service_name}.service"

    @property
    def url(self) -> str:
        """Where the server answers on its own host."""
        return network.url(network.LOOPBACK, self.port)


def profile_named(data: Any, name: Any) -> dict:
    """The profile `name` of the host's `profiles` (group_data/all.py, a site's), checked: an unknown name
    raises BadHostData in one line with the nearest profile, as a misspelt knob meets its nearest knob
    (deployment/schema.py)."""
    profiles = data.profiles if isinstance(data.profiles, dict) else {}
    if isinstance(name, str) and name in profiles:
        knobs.matching("profile", name, knobs.PROFILE_NAME, "a profile name of letters, digits and _.- "
                       "(a key of group_data/all.py profiles)")
        return profiles[name]
    known = ", ".join(sorted(profiles))
    near = difflib.get_close_matches(str(name), list(profiles), n=1)
    fix = f"did you mean {near[0]!r}? (profiles: {known};" if near else f"use one of {known} (profiles of"
    raise knobs.refused("profile", name, f"{fix} group_data/all.py and a site's)", wrong="is no profile")


def served_model_name(data: Any, profile_name: str | None = None) -> str:
    """The model name a profile (by default the host's `profile`) serves under (its workers' and its
    gateway's), checked."""
    profile = profile_named(data, profile_name or data.profile)
    return knobs.matching("served_model_name", profile.get("served_model_name") or profile["target"]["repo"],
                          re.compile(r"[A-Za-z0-9][A-Za-z0-9._/-]*"), "letters, digits and ._/-")


def git_refs(requirement: str) -> list[tuple[str, str]]:
    """(repository URL, ref) of each git source in a pip requirement."""
    return GIT_REF.findall(requirement)


def pinned_requirement(requirement: str, pins: dict) -> str:
    """`requirement` with each git ref that `pins` (group data `pins`: {"git": {"URL@REF": COMMIT}}) resolves
    replaced by its commit."""
    git = (pins or {}).get("git", {})

    def commit(match: re.Match) -> str:
        url, ref = match.groups()
        found = git.get(f"{url}@{ref}")
        return match.group(0) if found is None else \
            f"git+{url}@{knobs.matching(f'pins git {url}@{ref}', found, knobs.COMMIT, 'a 40-hex commit')}"

    return GIT_REF.sub(commit, requirement)


def sglang_requirement(data: Any, profile_name: str, profile: dict) -> str:
    """The SGLang build a profile's servers install: its requirement, through the site's mirrors and at the
    commits `pins` resolved its git refs to; checked."""
    wanted = profile["sglang"]["requirement"]
    requirements = (data.mirrors or {}).get("requirements", {})
    return knobs.requirement(f"profiles[{profile_name!r}]['sglang']['requirement']",
                             pinned_requirement(requirements.get(wanted, wanted), getattr(data, "pins", None)),
                             "a pip requirement on one line (name==version, 'name @ URL' or a wheel path)")


def sglang_build(requirement: str) -> str:
    """What tells one SGLang build from another: the commit of its git source, else the requirement itself
    (a release pin or a wheel)."""
    refs = git_refs(requirement)
    return refs[0][1] if refs else requirement


def _speculative(profile_name: str, values: Any) -> Speculative:
    if values is None:  # a profile without `speculative` serves autoregressively
        return autoregressive()
    optional = settings()
    if not isinstance(values, dict) or set(values) - {"algorithm", "num_draft_tokens", *optional} \
            or "algorithm" not in values or "num_draft_tokens" not in values:
        raise knobs.refused(f"profiles[{profile_name!r}]['speculative']", values, "use a dict with algorithm and "
                            f"num_draft_tokens, optionally {', '.join(optional)}")
    where = f"profiles[{profile_name!r}]['speculative']"
    names = drafting()
    return Speculative(
        algorithm=knobs.matching(f"{where}['algorithm']", values["algorithm"],
                                 re.compile("|".join(map(re.escape, names))),
                                 f"an SGLang algorithm name the deploy knows: {' or '.join(names)}"),
        num_draft_tokens=knobs.integer(f"{where}['num_draft_tokens']", values["num_draft_tokens"], minimum=1),
        values={key: knobs.integer(f"{where}[{key!r}]", values[key], minimum=1)
                for key in optional if values.get(key) is not None},
    )


def service_host(data: Any) -> ServiceHost:
    """What every server of the host shares, from its data; a bad value raises BadHostData."""
    service = ServiceHost(
        service_user=schema.value(data, "service_user"),
        download_user=schema.value(data, "download_user"),
        install_dir=schema.value(data, "install_dir"),
        config_dir=schema.value(data, "config_dir"),
        service_prefix=schema.value(data, "service_name"),
        longest_generation_s=schema.value(data, "longest_generation_s"),
        api_key_env=schema.value(data, "api_key_env"),
        remove_api_key=schema.value(data, "remove_api_key"),
        pip_index_url=schema.value(data, "pip_index_url"),
        bind_address=schema.value(data, "bind_address"),
        weights_fanout_port=schema.value(data, "weights_fanout_port"),
        ip_allow=schema.value(data, "server_ip_allow"),
        enable_metrics=schema.value(data, "enable_metrics"),
        ready_timeout_s=schema.value(data, "ready_timeout_s"))
    if service.download_user == service.service_user:
        raise knobs.refused("download_user", service.download_user, "give the downloads a user of their own, so "
                            "the token is never readable by the user that runs the model's code",
                            wrong="is the service user")
    return service


def deployment_user(service: ServiceHost, name: str, several: bool) -> str:
    """Who runs a deployment's servers: the host's service user where the host serves one deployment; where
    it serves several, a user of each one's own, SERVICE_USER-NAME (in the service user's group, which reads
    the weights and the keys: ownership.service_user), so that no deployment's model code writes another's
    `.cache` (the .so files Triton and torch compile and then load) or signals its processes."""
    if not several:
        return service.service_user
    user = f"{service.service_user}-{name}"
    if not knobs.USER_NAME.fullmatch(user):
        raise knobs.refused(f"deployments[{name!r}]['name']", name, "a host of several deployments runs each as "
                            "SERVICE_USER-NAME: use a name of lower-case letters, digits and _ (or a shorter "
                            "service_user)", wrong=f"makes the user {user!r}, not a user name ([a-z_][a-z0-9_-], "
                            "at most 32)")
    return user


def ports(data: Any) -> tuple[int, int]:
    """The host's first HTTP port and --nccl-port (`port`, `nccl_port`), which the layout moves per replica."""
    return schema.value(data, "port"), schema.value(data, "nccl_port")


def speculative_of(profile_name: str, profile: dict) -> Speculative:
    """A profile's speculative settings (none: AR), checked, and its drafter with them: named where its
    algorithm drafts with one, absent where it does not (AR, a model's own draft layers)."""
    spec = _speculative(profile_name, profile.get("speculative"))
    if spec.entry.drafter and "drafter" not in profile:
        raise knobs.refused(f"profiles[{profile_name!r}]['drafter']", None, f"{spec.algorithm} drafts with a "
                            "separate drafter: name it, drafter=dict(repo=..., revision=...)", wrong="is missing")
    if not spec.entry.drafter and "drafter" in profile:
        raise knobs.refused(f"profiles[{profile_name!r}]['drafter']", profile["drafter"], f"{spec.algorithm} "
                            "loads no separate drafter: remove it", wrong="is not used")
    return spec


def engine(data: Any, service: ServiceHost, host_class: str, profile_name: str, profile: dict, deployment: str,
           weights: tuple[str, str | None], plan: Layout, group: NodeGroup | None, after_fabric_manager: bool,
           user: str) -> Engine:
    """What the servers of `profile` on a host of `host_class` run, one a replica of `plan` (its GPUs, ports
    and TP size), loading `weights` (the target's and the drafter's directories, None without a drafter); `group`: the node group
    this host is part of; `user`: who its servers run as (`deployment_user`). A bad value raises
    BadHostData."""
    tuning = data.sglang_tuning
    attention = profile["attention"]
    backends = tuning["attention_backends"]
    if attention not in backends:
        raise knobs.refused(f"profiles[{profile_name!r}]['attention']", attention,
                            f"use one of {', '.join(sorted(backends))} (sglang_tuning attention_backends of "
                            f"{host_class})")
    target_backend, draft_backend = backends[attention]
    # A profile whose algorithm allows one backend only (DDTree: triton) names it; it wins on every class.
    target_backend = profile.get("attention_backend", target_backend)
    if "tp_size" in tuning:
        raise knobs.refused("sglang_tuning['tp_size']", tuning["tp_size"], "the TP size belongs to the class and the "
                            f"profile: set layouts[{profile_name!r}]['tp_size'] in group_data/{host_class}.py")
    requirement = sglang_requirement(data, profile_name, profile)
    owned = deploy_flags(plan, profile_name)
    env = {**knobs.environment("sglang_tuning env", tuning.get("env", {})),
           **knobs.environment(f"profiles[{profile_name!r}]['env']", profile.get("env", {}))}
    if group is not None:
        env = {**env, **group.env()}
    elif not service.exposed:  # a site's own setting wins
        env = {**LOOPBACK_SOCKETS, **env}
    return Engine(
        name=deployment,
        user=user,
        profile_name=profile_name,
        host_class=host_class,
        served_model_name=served_model_name(data, profile_name),
        model_dir=weights[0],
        draft_model_dir=weights[1],
        sglang_requirement=requirement,
        sglang_version=knobs.matching("sglang version", profile["sglang"]["version"], knobs.VERSION,
                                      "a version like 0.5.23"),
        venv_name=venv_name(requirement, service.pip_index_url),
        speculative=speculative_of(profile_name, profile),
        attention_backend=knobs.matching("attention backend", target_backend, knobs.BACKEND, "an SGLang backend name"),
        draft_attention_backend=knobs.matching("draft attention backend", draft_backend, knobs.BACKEND,
                                               "an SGLang backend name"),
        layout=plan,
        mem_fraction_static=knobs.fraction("sglang_tuning mem_fraction_static", tuning["mem_fraction_static"]),
        extra_args=(*knobs.arguments("sglang_tuning extra_args", tuning.get("extra_args", []), owned),
                    *knobs.arguments(f"profiles[{profile_name!r}]['server_args']", profile.get("server_args", []),
                                     owned)),
        env=env,
        service=service,
        after_fabric_manager=after_fabric_manager,
        node_args=() if group is None else tuple(group.server_args()),
        drains_on_stop=True if group is None else group.serves_http,
    )


def venv_name(requirement: str, index_url: str | None) -> str:
    """A build's SGLang virtualenv under install_dir, one per build fingerprint (its requirement, lock and
    index: deployment/python/pinned.fingerprint): deployments of one build share it, and another build is
    installed beside it, never over the one a running server loads (a unit moves to it by its restart)."""
    return f"sglang-venv-{fingerprint(requirement, index_url)}"
