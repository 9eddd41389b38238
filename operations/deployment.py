"""The deployment one host gets: its profile, its class's expectations and tuning, every knob, resolved.

`resolve()` is the only reader of host data: deploy.py and every operation take the
`Deployment` it returns. Pure, so it is unit-tested without hosts.
"""

import posixpath
import re
from dataclasses import dataclass
from typing import Any

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
    verify_weights: bool
    ready_timeout_s: int

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


class BadKnob(ValueError):
    """A host data value that cannot be used; the message is one line naming knob, value and what is accepted."""


def _boolean(name: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    words = {"true": True, "yes": True, "1": True, "false": False, "no": False, "0": False}
    if str(value).strip().lower() in words:
        return words[str(value).strip().lower()]
    raise BadKnob(f"{name}={value!r} is not a boolean: use true/false, yes/no or 1/0")


def _integer(name: str, value: Any, minimum: int = 0) -> int:
    if isinstance(value, bool) or not re.fullmatch(r"\s*\d+\s*", str(value)):
        raise BadKnob(f"{name}={value!r} is not a whole number: use digits only, at least {minimum}")
    number = int(value)
    if number < minimum:
        raise BadKnob(f"{name}={value!r} is too small: use a whole number of at least {minimum}")
    return number


def _mirror_repo(mirrors: dict, repo_id: str, revision: str) -> tuple[str, str]:
    replacement = mirrors.get("repos", {}).get(repo_id)
    if not replacement:
        return repo_id, revision
    mirror_id, _, mirror_revision = replacement.partition("@")
    return mirror_id, mirror_revision or revision


def expected_gpus(values: dict) -> GpuExpectations:
    """A class's `expected_gpus` dict (group_data/<class>.py) as the typed expectations."""
    return GpuExpectations(**{**values, "name_patterns": tuple(values["name_patterns"]),
                              "driver_min": int(values["driver_min"])})


def resolve(data: Any, host_class: str) -> Deployment:
    """Resolve `host.data` (or any object with the same attributes) for a host of `host_class`."""
    if data.profile not in data.profiles:
        raise ValueError(f"profile {data.profile!r} is not one of {sorted(data.profiles)} (group_data/all.py)")
    profile = data.profiles[data.profile]
    tuning = data.sglang_tuning
    mirrors = data.mirrors or {}
    requirements = mirrors.get("requirements", {})

    def repo(role: str) -> Repo:
        repo_id, revision = _mirror_repo(mirrors, profile[role]["repo"], profile[role]["revision"])
        # Directories are named after the real repo, so a mirror swap keeps paths stable.
        name = profile[role]["repo"].replace("/", "--")
        return Repo(role, repo_id, revision, posixpath.join(data.weights_dir, name))

    requirement = profile["sglang"]["requirement"]
    backends = tuning["attention_backends"][profile["attention"]]
    return Deployment(
        host_class=host_class,
        expected_gpus=expected_gpus(data.expected_gpus),
        profile_name=data.profile,
        target=repo("target"),
        drafter=repo("drafter"),
        sglang_requirement=requirements.get(requirement, requirement),
        sglang_version=profile["sglang"]["version"],
        huggingface_hub_requirement=requirements.get(data.huggingface_hub_requirement,
                                                     data.huggingface_hub_requirement),
        speculative=Speculative(**profile["speculative"]),
        attention_backend=backends[0],
        draft_attention_backend=backends[1],
        tp_size=_integer("tp_size", tuning["tp_size"], minimum=1),
        mem_fraction_static=float(tuning["mem_fraction_static"]),
        served_model_name=served_model_name(data),
        extra_args=(*tuning.get("extra_args", ()), *profile.get("server_args", ())),
        env={**tuning.get("env", {}), **profile.get("env", {})},
        service_name=data.service_name,
        service_user=data.service_user,
        install_dir=data.install_dir,
        config_dir=data.config_dir,
        bind_address=data.bind_address,
        port=_integer("port", data.port, minimum=1),
        enable_metrics=_boolean("enable_metrics", data.enable_metrics),
        hf_endpoint=data.hf_endpoint,
        pip_index_url=data.pip_index_url,
        hf_token_env=data.hf_token_env,
        api_key_env=data.api_key_env,
        install_driver=_boolean("install_driver", data.install_driver),
        driver_branch=str(_integer("driver_branch", data.driver_branch, minimum=1)),
        verify_weights=_boolean("verify_weights", data.verify_weights),
        ready_timeout_s=_integer("ready_timeout_s", data.ready_timeout_s, minimum=1),
    )


def served_model_name(data: Any) -> str:
    """The model name the host's profile serves under (its workers' and its gateway's)."""
    profile = data.profiles[data.profile]
    return profile.get("served_model_name") or profile["target"]["repo"]


def host_class_of(group_names) -> str:
    """The one class group (group_data/<class>.py) an inventory puts a host in."""
    classes = sorted({name for name in group_names if name in HOST_CLASSES})
    if len(classes) != 1:
        raise ValueError(f"a host must be in exactly one of the inventory groups {', '.join(HOST_CLASSES)}, "
                         f"found {classes or 'none'}")
    return classes[0]
