"""The SGLang servers one host runs: each replica of each deployment is a `Server`, with its profile's
model and speculative settings, its class's tuning, its layout's GPUs and port (operations/server/layout.py),
the service's names, paths and network; typed, checked."""

import re
from dataclasses import dataclass, field, replace
from typing import Any

from operations.basics import knobs, network
from operations.server.layout import Layout, unit_name
from operations.server.speculative import Speculative, drafting, settings

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


# The options the deploy sets itself, each with the knob that sets it: what flags.server_args renders
# (every spelling SGLang 0.5.23 accepts, flags.RENAMED_FLAGS' old ones too), a node group's part
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


@dataclass(frozen=True)
class Server:
    """What one SGLang unit (one replica of a deployment) serves and how. The replicas of a deployment share
    everything but their unit, GPUs and port."""

    profile_name: str
    host_class: str
    served_model_name: str
    model_dir: str  # the target's weights directory
    draft_model_dir: str  # the drafter's
    sglang_requirement: str
    sglang_version: str
    pip_index_url: str | None
    speculative: Speculative
    attention_backend: str
    draft_attention_backend: str
    tp_size: int
    mem_fraction_static: float
    extra_args: tuple[str, ...]
    env: dict[str, str]
    service_name: str  # this replica's unit (layout.unit_name); `service_prefix` before the layout is applied
    service_user: str
    download_user: str  # owns the HF token and the weights (operations/weights/config.py Weights.owner)
    install_dir: str
    config_dir: str
    bind_address: str
    port: int
    nccl_port: int  # its TCPStore's (--nccl-port; layout.nccl_ports): the knob's before the layout is applied
    enable_metrics: bool
    api_key_env: str
    remove_api_key: bool  # only this removes a key from a host; the server must then bind to loopback
    ready_timeout_s: int | None  # None: from the weights' size (readiness.ready_timeout)
    longest_generation_s: int  # the longest a request may run: how long a stop waits for those in flight
    after_fabric_manager: bool = False  # NVSwitch boards: CUDA needs fabric manager first
    node_args: tuple[str, ...] = field(default=())  # a node group's part (operations/nodes)
    # Whether the main process holds requests to finish on a stop: a server alone, or a node group's
    # rank 0 (NodeGroup.serves_http); a rank >= 1 serves only SGLang's dummy health server.
    drains_on_stop: bool = True
    service_prefix: str = "sglang"  # the `service_name` knob: every replica's unit is named PREFIX@...
    deployment: str = ""  # the deployment this replica belongs to (its name on the host)
    gpus: tuple[int, ...] = ()  # this replica's GPUs (nvidia-smi indices); () before the layout is applied
    venv_name: str = "sglang-venv"  # its SGLang virtualenv, under install_dir (one per SGLang build on a host)

    @property
    def exposed(self) -> bool:
        """The server is reachable beyond the host itself."""
        return not network.is_loopback(self.bind_address)

    @property
    def venv(self) -> str:
        return f"{self.install_dir}/{self.venv_name}"

    @property
    def gpu_env(self) -> dict[str, str]:
        """The replica's GPUs as CUDA numbers them: by PCI bus, as nvidia-smi's indices (CUDA's own default
        order is fastest first: CUDA C Programming Guide, "CUDA Environment Variables")."""
        if not self.gpus:
            return {}
        return {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": ",".join(map(str, self.gpus))}

    @property
    def service_home(self) -> str:
        return f"/home/{self.service_user}"

    @property
    def download_home(self) -> str:
        """The download user's home: no process of the service user reaches it."""
        return f"/home/{self.download_user}"

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
    def server_hf_home(self) -> str:
        """The server's own HF_HOME (transformers' cache of a model's remote code), apart from the
        token's (`hf_home`), which the unit makes inaccessible to the server."""
        return f"{self.service_home}/.cache/sglang-huggingface"

    @property
    def env_file(self) -> str:
        return f"{self.config_dir}/{self.service_name}.env"

    @property
    def api_key_file(self) -> str:
        return f"{self.config_dir}/api-key"

    @property
    def admin_key_file(self) -> str:
        """The host's worker admin key (SGLang --admin-api-key): generated on the host, never the clients'."""
        return f"{self.config_dir}/admin-api-key"

    @property
    def unit_file(self) -> str:
        return f"/etc/systemd/system/{self.service_name}.service"

    @property
    def stop_timeout_s(self) -> int:
        """The unit's TimeoutStopSec: the longest generation, then SGLang's own shutdown."""
        return self.longest_generation_s + SHUTDOWN_S

    @property
    def url(self) -> str:
        """Where the server answers on its own host."""
        return network.url(network.LOOPBACK, self.port)


def served_model_name(data: Any, profile_name: str | None = None) -> str:
    """The model name a profile (by default the host's `profile`) serves under (its workers' and its
    gateway's), checked."""
    profile = data.profiles[profile_name or data.profile]
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


def _speculative(profile_name: str, values: Any) -> Speculative:
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


def resolve(data: Any, host_class: str, profile_name: str, profile: dict, model_dir: str,
            draft_model_dir: str) -> Server:
    """The server of `profile` on a host of `host_class`, from its data; a bad value raises BadHostData."""
    tuning = data.sglang_tuning
    requirements = (data.mirrors or {}).get("requirements", {})
    wanted = profile["sglang"]["requirement"]
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
    prefix = knobs.matching("service_name", data.service_name, knobs.UNIT_NAME, "a unit name (letters, digits, _.-)")
    return Server(
        profile_name=profile_name,
        host_class=host_class,
        served_model_name=served_model_name(data, profile_name),
        model_dir=model_dir,
        draft_model_dir=draft_model_dir,
        sglang_requirement=knobs.requirement(f"profiles[{profile_name!r}]['sglang']['requirement']",
                                             pinned_requirement(requirements.get(wanted, wanted), getattr(data, "pins", None)),
                                             "a pip requirement on one line (name==version, 'name @ URL' or a "
                                             "wheel path)"),
        sglang_version=knobs.matching("sglang version", profile["sglang"]["version"], knobs.VERSION,
                                      "a version like 0.5.23"),
        pip_index_url=knobs.index_url(data),
        speculative=_speculative(profile_name, profile["speculative"]),
        attention_backend=knobs.matching("attention backend", target_backend, knobs.BACKEND, "an SGLang backend name"),
        draft_attention_backend=knobs.matching("draft attention backend", draft_backend, knobs.BACKEND,
                                               "an SGLang backend name"),
        tp_size=0,  # the layout's (replicas())
        mem_fraction_static=knobs.fraction("sglang_tuning mem_fraction_static", tuning["mem_fraction_static"]),
        extra_args=(*knobs.arguments("sglang_tuning extra_args", tuning.get("extra_args", []), DEPLOY_FLAGS),
                    *knobs.arguments(f"profiles[{profile_name!r}]['server_args']", profile.get("server_args", []),
                                     DEPLOY_FLAGS)),
        env={**knobs.environment("sglang_tuning env", tuning.get("env", {})),
             **knobs.environment(f"profiles[{profile_name!r}]['env']", profile.get("env", {}))},
        service_name=prefix,
        service_prefix=prefix,
        service_user=knobs.service_account("service_user", data.service_user),
        download_user=knobs.service_account("download_user", data.download_user),
        install_dir=knobs.path("install_dir", data.install_dir),
        config_dir=knobs.path("config_dir", data.config_dir),
        bind_address=knobs.address("bind_address", data.bind_address),
        port=knobs.integer("port", data.port, minimum=1, maximum=65535),
        nccl_port=knobs.integer("nccl_port", data.nccl_port, minimum=1024, maximum=65535),
        enable_metrics=knobs.boolean("enable_metrics", data.enable_metrics),
        api_key_env=knobs.matching("api_key_env", data.api_key_env, knobs.ENV_NAME, "a variable name"),
        remove_api_key=knobs.boolean("remove_api_key", data.remove_api_key),
        ready_timeout_s=None if data.ready_timeout_s is None else knobs.integer("ready_timeout_s",
                                                                                data.ready_timeout_s, minimum=1),
        longest_generation_s=knobs.integer("longest_generation_s", data.longest_generation_s, minimum=1),
    )


def replicas(server: Server, deployment: str, layout: Layout) -> tuple[Server, ...]:
    """The deployment's servers, one a replica of the layout: its unit, GPUs, ports and TP size."""
    return tuple(replace(server, deployment=deployment, tp_size=layout.tp_size, gpus=gpus, port=port,
                         nccl_port=nccl_port, service_name=unit_name(server.service_prefix, deployment, gpus))
                 for gpus, port, nccl_port in zip(layout.groups, layout.ports, layout.nccl_ports))
