"""The deployment one host gets: its profile, its class's expectations and tuning, every knob, resolved.

`resolve()` is the only reader of host data: deploy.py and every operation take the
`Deployment` it returns. Pure, so it is unit-tested without hosts.
"""

import ipaddress
import posixpath
import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

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
    huggingface_hub_requirement: str
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
    gpu_smoke_engine: str | None  # None: the smoke test's own torch + NCCL workers; else a program's path

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
    def tools_venv(self) -> str:
        """huggingface_hub for the download units, apart from SGLang's own pins."""
        return f"{self.install_dir}/tools-venv"

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


class BadHostData(ValueError):
    """Host data that cannot be deployed; the message is one line naming the knob, its value and what is accepted."""


# What a value may look like before it reaches a shell, a unit file or a path.
SAFE_PATH = re.compile(r"^(/[A-Za-z0-9._-]+)+$")
USER_NAME = re.compile(r"^[a-z_][a-z0-9_-]{0,31}$")  # useradd's portable names
UNIT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
REPO_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}/[A-Za-z0-9][A-Za-z0-9._-]{0,95}$")
REVISION = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/-]{0,127}$")
ARGUMENT = re.compile(r"^[A-Za-z0-9._:/=,+@%-]+$")  # one word of SGLang's command line
ENV_VALUE = re.compile(r"^[A-Za-z0-9 ._:/=,+@%-]*$")
VERSION = re.compile(r"^\d+(\.\d+)*([.+][A-Za-z0-9.]+)?$")
REQUIREMENT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9 ._:/=<>!~,+@#%-]*$")  # PEP 508, a path or a URL
BACKEND = re.compile(r"^[a-z0-9_]+$")


def _boolean(name: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    words = {"true": True, "yes": True, "1": True, "false": False, "no": False, "0": False}
    if str(value).strip().lower() not in words:
        raise BadHostData(f"{name}={value!r} is not a boolean: use true/false, yes/no or 1/0")
    return words[str(value).strip().lower()]


def _integer(name: str, value: Any, minimum: int = 0, maximum: int | None = None) -> int:
    if isinstance(value, bool) or not re.fullmatch(r"\s*\d+\s*", str(value)) or int(value) < minimum \
            or (maximum is not None and int(value) > maximum):
        limits = f"from {minimum} to {maximum}" if maximum is not None else f"at least {minimum}"
        raise BadHostData(f"{name}={value!r} is not a whole number {limits}")
    return int(value)


def _fraction(name: str, value: Any) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        number = -1.0
    if isinstance(value, bool) or not 0 < number <= 1:
        raise BadHostData(f"{name}={value!r} is not a fraction: use a number above 0 and at most 1")
    return number


def _matching(name: str, value: Any, pattern: re.Pattern, accepted: str) -> str:
    if not isinstance(value, str) or not pattern.match(value) or ".." in value.split("/"):
        raise BadHostData(f"{name}={value!r} is not accepted: use {accepted}")
    return value


def _path(name: str, value: Any) -> str:
    if isinstance(value, str) and posixpath.normpath(value) != value:
        raise BadHostData(f"{name}={value!r} is not a normalized absolute path: use e.g. "
                          f"{posixpath.normpath(posixpath.join('/', value))!r}")
    return _matching(name, value, SAFE_PATH, "an absolute path of letters, digits and ._- (e.g. /srv/specfleet)")


def _url(name: str, value: Any) -> str | None:
    if value is None:
        return None
    parts = urlsplit(value) if isinstance(value, str) else None
    if not parts or parts.scheme not in ("http", "https") or not parts.hostname \
            or not re.fullmatch(r"[A-Za-z0-9._~:/?#\[\]@%=+,-]+", value):
        raise BadHostData(f"{name}={value!r} is not accepted: use an http(s) URL such as https://host/path, "
                          "or None")
    return value


def _address(name: str, value: Any) -> str:
    try:
        return str(ipaddress.ip_address(value))
    except ValueError:
        raise BadHostData(f"{name}={value!r} is not an IP address: use e.g. 127.0.0.1 (loopback), "
                          "or the host's address on the serving network") from None


def _names(name: str, values: Any, pattern: re.Pattern, accepted: str) -> tuple[str, ...]:
    if not isinstance(values, (list, tuple)):
        raise BadHostData(f"{name}={values!r} is not a list: use a list of {accepted}")
    return tuple(_matching(name, value, pattern, accepted) for value in values)


def _environment(name: str, values: Any) -> dict[str, str]:
    if not isinstance(values, dict):
        raise BadHostData(f"{name}={values!r} is not a dict: use dict(NAME='value')")
    return {_matching(f"{name} key", key, ENV_NAME, "a variable name ([A-Za-z_][A-Za-z0-9_]*)"):
            _matching(f"{name}[{key!r}]", str(value), ENV_VALUE, "letters, digits, spaces and ._:/=,+@%-")
            for key, value in values.items()}


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
        count=_integer("expected_gpus count", values["count"], minimum=1),
        min_memory_mib=_integer("expected_gpus min_memory_mib", values["min_memory_mib"]),
        compute_capability=_matching("expected_gpus compute_capability", str(values["compute_capability"]),
                                     re.compile(r"^\d+\.\d+$"), "major.minor, e.g. 12.0"),
        interconnect=_matching("expected_gpus interconnect", values["interconnect"],
                               re.compile(r"^(nvlink|pcie)$"), "nvlink or pcie"),
        driver_min=_integer("expected_gpus driver_min", values["driver_min"], minimum=1),
        open_kernel_module=_boolean("expected_gpus open_kernel_module", values["open_kernel_module"]),
        fabric_manager=_boolean("expected_gpus fabric_manager", values["fabric_manager"]),
        allreduce_floor_gbps=_integer("expected_gpus allreduce_floor_gbps", values["allreduce_floor_gbps"], minimum=1),
    )


def _speculative(profile_name: str, values: Any) -> Speculative:
    fields = Speculative.__dataclass_fields__
    if not isinstance(values, dict) or set(values) - set(fields) or "algorithm" not in values \
            or "num_draft_tokens" not in values:
        raise BadHostData(f"profiles[{profile_name!r}]['speculative']={values!r} is not accepted: use a dict "
                          f"with algorithm and num_draft_tokens, optionally draft_window_size, ddtree_budget")
    where = f"profiles[{profile_name!r}]['speculative']"
    optional = {key: _integer(f"{where}[{key!r}]", values[key], minimum=1)
                for key in ("draft_window_size", "ddtree_budget") if values.get(key) is not None}
    return Speculative(
        algorithm=_matching(f"{where}['algorithm']", values["algorithm"], re.compile(r"^[A-Z0-9_]+$"),
                            "an SGLang algorithm name such as DFLASH or DDTREE"),
        num_draft_tokens=_integer(f"{where}['num_draft_tokens']", values["num_draft_tokens"], minimum=1),
        **optional,
    )


def resolve(data: Any, host_class: str) -> Deployment:
    """Resolve `host.data` (or any object with the same attributes) for a host of `host_class`.

    Every value is parsed and checked here, before any host is touched: a value that cannot be
    deployed raises BadHostData, one line naming it and what is accepted.
    """
    profiles = data.profiles if isinstance(data.profiles, dict) else {}
    if data.profile not in profiles:
        raise BadHostData(f"profile={data.profile!r} is not one of {', '.join(sorted(profiles))} "
                          "(group_data/all.py profiles)")
    try:
        return _resolve(data, host_class, data.profile, profiles[data.profile])
    except (KeyError, TypeError, AttributeError, IndexError) as error:
        raise BadHostData(f"group data for profile {data.profile!r} on class {host_class} is incomplete or "
                          f"malformed ({type(error).__name__}: {error}): compare it with group_data/all.py "
                          f"and group_data/{host_class}.py") from None


def _resolve(data: Any, host_class: str, profile_name: str, profile: dict) -> Deployment:
    tuning = data.sglang_tuning
    mirrors = data.mirrors or {}
    requirements = mirrors.get("requirements", {})
    weights_dir = _path("weights_dir", data.weights_dir)

    def repo(role: str) -> Repo:
        real_id = _matching(f"profiles[{profile_name!r}][{role!r}]['repo']", profile[role]["repo"], REPO_ID,
                            "a hub repo id, owner/name")
        repo_id, revision = _mirror_repo(mirrors, real_id, profile[role]["revision"])
        # Directories are named after the real repo, so a mirror swap keeps paths stable.
        return Repo(role,
                    _matching(f"{role} repo (mirrors)", repo_id, REPO_ID, "a hub repo id, owner/name"),
                    _matching(f"{role} revision", revision, REVISION, "a 40-hex commit (or a branch or tag name)"),
                    posixpath.join(weights_dir, real_id.replace("/", "--")))

    def requirement(name: str, wanted: Any) -> str:
        chosen = requirements.get(wanted, wanted)
        return _matching(name, chosen, REQUIREMENT, "a pip requirement on one line (name==version, "
                         "'name @ URL' or a wheel path)")

    attention = profile["attention"]
    backends = tuning["attention_backends"]
    if attention not in backends:
        raise BadHostData(f"profiles[{profile_name!r}]['attention']={attention!r} is not one of "
                          f"{', '.join(sorted(backends))} (sglang_tuning attention_backends of {host_class})")
    target_backend, draft_backend = backends[attention]
    return Deployment(
        host_class=host_class,
        expected_gpus=expected_gpus(data.expected_gpus),
        profile_name=profile_name,
        target=repo("target"),
        drafter=repo("drafter"),
        sglang_requirement=requirement(f"profiles[{profile_name!r}]['sglang']['requirement']",
                                       profile["sglang"]["requirement"]),
        sglang_version=_matching("sglang version", profile["sglang"]["version"], VERSION, "a version like 0.5.23"),
        huggingface_hub_requirement=requirement("huggingface_hub_requirement", data.huggingface_hub_requirement),
        speculative=_speculative(profile_name, profile["speculative"]),
        attention_backend=_matching("attention backend", target_backend, BACKEND, "an SGLang backend name"),
        draft_attention_backend=_matching("draft attention backend", draft_backend, BACKEND,
                                          "an SGLang backend name"),
        tp_size=_integer("sglang_tuning tp_size", tuning["tp_size"], minimum=1),
        mem_fraction_static=_fraction("sglang_tuning mem_fraction_static", tuning["mem_fraction_static"]),
        served_model_name=served_model_name(data),
        extra_args=(*_names("sglang_tuning extra_args", tuning.get("extra_args", []), ARGUMENT,
                            "single words (letters, digits, ._:/=,+@%-)"),
                    *_names(f"profiles[{profile_name!r}]['server_args']", profile.get("server_args", []),
                            ARGUMENT, "single words (letters, digits, ._:/=,+@%-)")),
        env={**_environment("sglang_tuning env", tuning.get("env", {})),
             **_environment(f"profiles[{profile_name!r}]['env']", profile.get("env", {}))},
        service_name=_matching("service_name", data.service_name, UNIT_NAME, "a unit name (letters, digits, _.-)"),
        service_user=_matching("service_user", data.service_user, USER_NAME,
                               "a user name ([a-z_][a-z0-9_-], at most 32)"),
        install_dir=_path("install_dir", data.install_dir),
        config_dir=_path("config_dir", data.config_dir),
        bind_address=_address("bind_address", data.bind_address),
        port=_integer("port", data.port, minimum=1, maximum=65535),
        enable_metrics=_boolean("enable_metrics", data.enable_metrics),
        hf_endpoint=_url("hf_endpoint", data.hf_endpoint),
        pip_index_url=_url("pip_index_url", data.pip_index_url),
        hf_token_env=_matching("hf_token_env", data.hf_token_env, ENV_NAME, "a variable name"),
        api_key_env=_matching("api_key_env", data.api_key_env, ENV_NAME, "a variable name"),
        install_driver=_boolean("install_driver", data.install_driver),
        driver_branch=str(_integer("driver_branch", data.driver_branch, minimum=1)),
        nvidia_repo_url=_url("nvidia_repo_url", data.nvidia_repo_url),
        verify_weights=_boolean("verify_weights", data.verify_weights),
        ready_timeout_s=None if data.ready_timeout_s is None else _integer("ready_timeout_s", data.ready_timeout_s,
                                                                             minimum=1),
        remove_api_key=_boolean("remove_api_key", data.remove_api_key),
        allow_branch_revisions=_boolean("allow_branch_revisions", data.allow_branch_revisions),
        gpu_smoke_engine=None if data.gpu_smoke_engine is None else _path("gpu_smoke_engine", data.gpu_smoke_engine),
    )


def served_model_name(data: Any) -> str:
    """The model name the host's profile serves under (its workers' and its gateway's), checked."""
    profile = data.profiles[data.profile]
    return _matching("served_model_name", profile.get("served_model_name") or profile["target"]["repo"],
                     re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/-]*$"), "letters, digits and ._/-")


def host_class_of(group_names) -> str:
    """The one class group (group_data/<class>.py) an inventory puts a host in."""
    classes = sorted({name for name in group_names if name in HOST_CLASSES})
    if len(classes) != 1:
        raise BadHostData(f"the host is in {' and '.join(classes) if classes else 'no'} class group"
                          f"{'s' if len(classes) > 1 else ''}: put it in exactly one of the inventory "
                          f"groups {', '.join(HOST_CLASSES)}")
    return classes[0]
