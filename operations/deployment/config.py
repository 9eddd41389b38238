"""The deployment one host gets: its profile, its class's expectations and tuning, every knob, resolved.

`resolve()` is the only reader of host data: deploy.py and every operation take the
`Deployment` it returns. Pure, so it is unit-tested without hosts. The parsers and validators it
applies to each value live in operations/knobs.py.
"""

import ipaddress
import posixpath
import re
from dataclasses import dataclass, replace
from typing import Any

from operations.basics import knobs
from operations.nodes import group as nodes
from operations.basics.knobs import BadHostData

COMMIT = re.compile(r"^[0-9a-f]{40}$")  # a pinned revision; anything else is a branch or tag

# The host classes. Each is an inventory group, and group_data/<class>.py says what its
# GPUs must be (`expected_gpus`) and how SGLang is tuned for them (`sglang_tuning`).
# The value is the class's short name (lab host names such as lab-pcie-1, `lab up --hosts`).
HOST_CLASSES = {"rtx_pro_6000_pcie": "pcie", "b200_nvlink": "b200", "b300_nvlink": "b300"}


@dataclass(frozen=True)
class GpuExpectations:
    """What the hardware of a host class must be (group_data/<class>.py `expected_gpus`)."""

    name_patterns: tuple[str, ...]  # regexes over `nvidia-smi --query-gpu=name`
    count: int
    min_memory_mib: int
    compute_capability: str  # "12.0"
    interconnect: str  # "nvlink" (every pair NV#) or "pcie"
    driver_min: int  # driver branch
    open_kernel_module: bool
    fabric_manager: bool  # NVSwitch boards
    allreduce_floor_gbps: int  # GB/s: the GPU smoke test's all-reduce bus bandwidth floor (operations/gpu/smoke.py)


@dataclass(frozen=True)
class Speculative:
    """The profile's speculative decoding settings (group_data/all.py `profiles[...]['speculative']`)."""

    algorithm: str  # "DFLASH" or "DDTREE"
    num_draft_tokens: int
    draft_window_size: int | None = None
    ddtree_budget: int | None = None


@dataclass(frozen=True)
class Repo:
    """A hub repository as this host fetches it (after mirrors), and where it lands."""

    role: str  # "target" or "drafter"
    repo_id: str
    revision: str  # a commit, or a branch that preflight resolves
    local_dir: str

    @property
    def unit_name(self) -> str:
        return f"specfleet-weights-{self.role}"


@dataclass(frozen=True)
class Deployment:
    host_class: str
    expected_gpus: GpuExpectations
    profile_name: str
    target: Repo
    drafter: Repo
    sglang_requirement: str
    sglang_version: str
    speculative: Speculative
    attention_backend: str
    draft_attention_backend: str
    tp_size: int
    mem_fraction_static: float
    served_model_name: str
    extra_args: tuple[str, ...]
    env: dict[str, str]
    service_name: str
    service_user: str
    install_dir: str
    config_dir: str
    bind_address: str
    port: int
    enable_metrics: bool
    hf_endpoint: str | None
    pip_index_url: str | None
    hf_token_env: str
    api_key_env: str
    install_driver: bool
    driver_branch: str  # digits, as the driver's version string starts
    nvidia_repo_url: str  # NVIDIA's CUDA repositories, <os release>/<arch>/ below it
    verify_weights: bool
    ready_timeout_s: int | None  # None: from the weights' size (readiness.ready_timeout)
    remove_api_key: bool  # only this removes a key from a host; the server must then bind to loopback
    allow_branch_revisions: bool  # deploy whatever a branch points at now, with a warning
    test_only_skip_drain: bool  # tests only: restart behind a gateway without draining (requests fail)
    gpu_smoke_engine: str | None  # None: the smoke test's own torch + NCCL workers; else a program's path
    node_group: nodes.NodeGroup | None = None  # a server spanning several hosts: this host's part (operations/nodes)

    @property
    def exposed(self) -> bool:
        """The server is reachable beyond the host itself."""
        return not ipaddress.ip_address(self.bind_address).is_loopback

    @property
    def repos(self) -> list[Repo]:
        return [self.target, self.drafter]

    @property
    def venv(self) -> str:
        return f"{self.install_dir}/sglang-venv"

    @property
    def service_home(self) -> str:
        return f"/home/{self.service_user}"

    @property
    def hf_home(self) -> str:
        return f"{self.service_home}/.cache/huggingface"

    @property
    def env_file(self) -> str:
        return f"{self.config_dir}/{self.service_name}.env"

    @property
    def api_key_file(self) -> str:
        return f"{self.config_dir}/api-key"

    @property
    def unit_file(self) -> str:
        return f"/etc/systemd/system/{self.service_name}.service"


def _mirror_repo(mirrors: dict, repo_id: str, revision: str) -> tuple[str, str]:
    replacement = mirrors.get("repos", {}).get(repo_id)
    if not replacement:
        return repo_id, revision
    mirror_id, _, mirror_revision = replacement.partition("@")
    return mirror_id, mirror_revision or revision


def expected_gpus(values: dict) -> GpuExpectations:
    """A class's `expected_gpus` dict (group_data/<class>.py) as the typed expectations."""
    if not isinstance(values, dict):
        raise BadHostData(f"expected_gpus={values!r} is not a dict: define it in group_data/<class>.py")
    unknown = sorted(set(values) - set(GpuExpectations.__dataclass_fields__))
    missing = sorted(set(GpuExpectations.__dataclass_fields__) - set(values))
    if unknown or missing:
        raise BadHostData(f"expected_gpus has {'unknown keys ' + ', '.join(unknown) if unknown else ''}"
                          f"{' and ' if unknown and missing else ''}{'no ' + ', '.join(missing) if missing else ''}: "
                          f"use exactly {', '.join(GpuExpectations.__dataclass_fields__)}")
    return GpuExpectations(
        name_patterns=tuple(values["name_patterns"]),
        count=knobs.integer("expected_gpus count", values["count"], minimum=1),
        min_memory_mib=knobs.integer("expected_gpus min_memory_mib", values["min_memory_mib"]),
        compute_capability=knobs.matching("expected_gpus compute_capability", str(values["compute_capability"]),
                                     re.compile(r"^\d+\.\d+$"), "major.minor, e.g. 12.0"),
        interconnect=knobs.matching("expected_gpus interconnect", values["interconnect"],
                                    re.compile(r"^(nvlink|pcie)$"), "nvlink or pcie"),
        driver_min=knobs.integer("expected_gpus driver_min", values["driver_min"], minimum=1),
        open_kernel_module=knobs.boolean("expected_gpus open_kernel_module", values["open_kernel_module"]),
        fabric_manager=knobs.boolean("expected_gpus fabric_manager", values["fabric_manager"]),
        allreduce_floor_gbps=knobs.integer("expected_gpus allreduce_floor_gbps", values["allreduce_floor_gbps"],
                                           minimum=1),
    )


def _speculative(profile_name: str, values: Any) -> Speculative:
    fields = Speculative.__dataclass_fields__
    if not isinstance(values, dict) or set(values) - set(fields) or "algorithm" not in values \
            or "num_draft_tokens" not in values:
        raise BadHostData(f"profiles[{profile_name!r}]['speculative']={values!r} is not accepted: use a dict "
                          f"with algorithm and num_draft_tokens, optionally draft_window_size, ddtree_budget")
    where = f"profiles[{profile_name!r}]['speculative']"
    optional = {key: knobs.integer(f"{where}[{key!r}]", values[key], minimum=1)
                for key in ("draft_window_size", "ddtree_budget") if values.get(key) is not None}
    return Speculative(
        algorithm=knobs.matching(f"{where}['algorithm']", values["algorithm"], re.compile(r"^[A-Z0-9_]+$"),
                            "an SGLang algorithm name such as DFLASH or DDTREE"),
        num_draft_tokens=knobs.integer(f"{where}['num_draft_tokens']", values["num_draft_tokens"], minimum=1),
        **optional,
    )


def resolve(data: Any, host_class: str, node_members: dict | None = None) -> Deployment:
    """Resolve `host.data` (or any object with the same attributes) for a host of `host_class`;
    `node_members`: its node group's hosts (`nodes.members(inventory, host)`), if it is in one.

    Every value is parsed and checked here, before any host is touched: a value that cannot be
    deployed raises BadHostData, one line naming it and what is accepted.
    """
    profiles = data.profiles if isinstance(data.profiles, dict) else {}
    if data.profile not in profiles:
        raise BadHostData(f"profile={data.profile!r} is not one of {', '.join(sorted(profiles))} "
                          "(group_data/all.py profiles)")
    try:
        d = _resolve(data, host_class, data.profile, profiles[data.profile])
    except (KeyError, TypeError, AttributeError, IndexError) as error:
        raise BadHostData(f"group data for profile {data.profile!r} on class {host_class} is incomplete or "
                          f"malformed ({type(error).__name__}: {error}): compare it with group_data/all.py "
                          f"and group_data/{host_class}.py") from None
    group = nodes.group(data, host_class, data.profile, d.expected_gpus.count, d.port, node_members)
    if group is None:
        return d
    # One server over the group's nodes: TP over all their GPUs, the network between them named.
    return replace(d, node_group=group, tp_size=group.tp_size, env={**d.env, **group.env()})


def _resolve(data: Any, host_class: str, profile_name: str, profile: dict) -> Deployment:
    tuning = data.sglang_tuning
    mirrors = data.mirrors or {}
    requirements = mirrors.get("requirements", {})
    weights_dir = knobs.path("weights_dir", data.weights_dir)

    def repo(role: str) -> Repo:
        real_id = knobs.matching(f"profiles[{profile_name!r}][{role!r}]['repo']", profile[role]["repo"],
                                 knobs.REPO_ID, "a hub repo id, owner/name")
        repo_id, revision = _mirror_repo(mirrors, real_id, profile[role]["revision"])
        # Directories are named after the real repo, so a mirror swap keeps paths stable.
        return Repo(role,
                    knobs.matching(f"{role} repo (mirrors)", repo_id, knobs.REPO_ID, "a hub repo id, owner/name"),
                    knobs.matching(f"{role} revision", revision, knobs.REVISION,
                                   "a 40-hex commit (or a branch or tag name)"),
                    posixpath.join(weights_dir, real_id.replace("/", "--")))

    def requirement(name: str, wanted: Any) -> str:
        chosen = requirements.get(wanted, wanted)
        return knobs.matching(name, chosen, knobs.REQUIREMENT, "a pip requirement on one line (name==version, "
                              "'name @ URL' or a wheel path)")

    attention = profile["attention"]
    backends = tuning["attention_backends"]
    if attention not in backends:
        raise BadHostData(f"profiles[{profile_name!r}]['attention']={attention!r} is not one of "
                          f"{', '.join(sorted(backends))} (sglang_tuning attention_backends of {host_class})")
    target_backend, draft_backend = backends[attention]
    # A profile whose algorithm allows one backend only (DDTree: triton) names it; it wins on every class.
    target_backend = profile.get("attention_backend", target_backend)
    return Deployment(
        host_class=host_class,
        expected_gpus=expected_gpus(data.expected_gpus),
        profile_name=profile_name,
        target=repo("target"),
        drafter=repo("drafter"),
        sglang_requirement=requirement(f"profiles[{profile_name!r}]['sglang']['requirement']",
                                       profile["sglang"]["requirement"]),
        sglang_version=knobs.matching("sglang version", profile["sglang"]["version"], knobs.VERSION,
                                      "a version like 0.5.23"),
        speculative=_speculative(profile_name, profile["speculative"]),
        attention_backend=knobs.matching("attention backend", target_backend, knobs.BACKEND, "an SGLang backend name"),
        draft_attention_backend=knobs.matching("draft attention backend", draft_backend, knobs.BACKEND,
                                               "an SGLang backend name"),
        tp_size=knobs.integer("sglang_tuning tp_size", tuning["tp_size"], minimum=1),
        mem_fraction_static=knobs.fraction("sglang_tuning mem_fraction_static", tuning["mem_fraction_static"]),
        served_model_name=served_model_name(data),
        extra_args=(*knobs.names("sglang_tuning extra_args", tuning.get("extra_args", []), knobs.ARGUMENT,
                                 "single words (letters, digits, ._:/=,+@%-)"),
                    *knobs.names(f"profiles[{profile_name!r}]['server_args']", profile.get("server_args", []),
                                 knobs.ARGUMENT, "single words (letters, digits, ._:/=,+@%-)")),
        env={**knobs.environment("sglang_tuning env", tuning.get("env", {})),
             **knobs.environment(f"profiles[{profile_name!r}]['env']", profile.get("env", {}))},
        service_name=knobs.matching("service_name", data.service_name, knobs.UNIT_NAME,
                                    "a unit name (letters, digits, _.-)"),
        service_user=knobs.matching("service_user", data.service_user, knobs.USER_NAME,
                                    "a user name ([a-z_][a-z0-9_-], at most 32)"),
        install_dir=knobs.path("install_dir", data.install_dir),
        config_dir=knobs.path("config_dir", data.config_dir),
        bind_address=knobs.address("bind_address", data.bind_address),
        port=knobs.integer("port", data.port, minimum=1, maximum=65535),
        enable_metrics=knobs.boolean("enable_metrics", data.enable_metrics),
        hf_endpoint=knobs.url("hf_endpoint", data.hf_endpoint),
        pip_index_url=knobs.url("pip_index_url", data.pip_index_url),
        hf_token_env=knobs.matching("hf_token_env", data.hf_token_env, knobs.ENV_NAME, "a variable name"),
        api_key_env=knobs.matching("api_key_env", data.api_key_env, knobs.ENV_NAME, "a variable name"),
        install_driver=knobs.boolean("install_driver", data.install_driver),
        driver_branch=str(knobs.integer("driver_branch", data.driver_branch, minimum=1)),
        nvidia_repo_url=knobs.url("nvidia_repo_url", data.nvidia_repo_url),
        verify_weights=knobs.boolean("verify_weights", data.verify_weights),
        ready_timeout_s=None if data.ready_timeout_s is None else knobs.integer("ready_timeout_s",
                                                                                data.ready_timeout_s, minimum=1),
        remove_api_key=knobs.boolean("remove_api_key", data.remove_api_key),
        allow_branch_revisions=knobs.boolean("allow_branch_revisions", data.allow_branch_revisions),
        test_only_skip_drain=knobs.boolean("test_only_skip_drain", data.test_only_skip_drain),
        gpu_smoke_engine=None if data.gpu_smoke_engine is None else knobs.path("gpu_smoke_engine",
                                                                               data.gpu_smoke_engine),
    )


def served_model_name(data: Any) -> str:
    """The model name the host's profile serves under (its workers' and its gateway's), checked."""
    profile = data.profiles[data.profile]
    return knobs.matching("served_model_name", profile.get("served_model_name") or profile["target"]["repo"],
                          re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/-]*$"), "letters, digits and ._/-")


def host_class_of(group_names) -> str:
    """The one class group (group_data/<class>.py) an inventory puts a host in."""
    classes = sorted({name for name in group_names if name in HOST_CLASSES})
    if len(classes) != 1:
        raise BadHostData(f"the host is in {' and '.join(classes) if classes else 'no'} class group"
                          f"{'s' if len(classes) > 1 else ''}: put it in exactly one of the inventory "
                          f"groups {', '.join(HOST_CLASSES)}")
    return classes[0]
