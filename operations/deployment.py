"""The deployment one host gets: its profile, its class's tuning and any mirrors, resolved.

Pure: everything here is computed from host data, so it is unit-tested without hosts.
"""

import posixpath
import re
from dataclasses import dataclass, field
from typing import Any

COMMIT = re.compile(r"^[0-9a-f]{40}$")  # a pinned revision; anything else is a branch or tag


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
    profile_name: str
    target: Repo
    drafter: Repo
    sglang_requirement: str
    sglang_version: str
    speculative: dict[str, Any]
    attention_backend: str
    draft_attention_backend: str
    tp_size: int
    mem_fraction_static: float
    served_model_name: str
    extra_args: list[str]
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
    gpu: dict[str, Any] = field(default_factory=dict)

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
    def hf_home(self) -> str:
        return f"/home/{self.service_user}/.cache/huggingface"

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


def resolve(data: Any, host_class: str) -> Deployment:
    """Resolve `host.data` (or any object with the same attributes) for a host of `host_class`."""
    if data.profile not in data.profiles:
        raise ValueError(f"profile {data.profile!r} is not one of {sorted(data.profiles)} (group_data/all.py)")
    profile = data.profiles[data.profile]
    tuning = data.sglang_class
    mirrors = data.mirrors or {}
    target_name = profile["target"]["repo"]

    def repo(role: str) -> Repo:
        repo_id, revision = _mirror_repo(mirrors, profile[role]["repo"], profile[role]["revision"])
        # Directories are named after the real repo, so a mirror swap keeps paths stable.
        name = profile[role]["repo"].replace("/", "--")
        return Repo(role, repo_id, revision, posixpath.join(data.weights_dir, name))

    requirement = profile["sglang"]["requirement"]
    backends = tuning["attention_backends"][profile["attention"]]
    return Deployment(
        host_class=host_class,
        profile_name=data.profile,
        target=repo("target"),
        drafter=repo("drafter"),
        sglang_requirement=mirrors.get("requirements", {}).get(requirement, requirement),
        sglang_version=profile["sglang"]["version"],
        speculative=dict(profile["speculative"]),
        attention_backend=backends[0],
        draft_attention_backend=backends[1],
        tp_size=int(tuning["tp_size"]),
        mem_fraction_static=float(tuning["mem_fraction_static"]),
        served_model_name=profile.get("served_model_name") or target_name,
        extra_args=[*tuning.get("extra_args", []), *profile.get("server_args", [])],
        env={**tuning.get("env", {}), **profile.get("env", {})},
        service_name=data.service_name,
        service_user=data.service_user,
        install_dir=data.install_dir,
        config_dir=data.config_dir,
        bind_address=data.bind_address,
        port=int(data.port),
        enable_metrics=bool(data.enable_metrics),
        hf_endpoint=data.hf_endpoint,
        pip_index_url=data.pip_index_url,
        gpu=dict(data.gpu or {}),
    )


HOST_CLASSES = ("rtx_pro_6000_pcie", "b200_nvlink", "b300_nvlink")


def host_class_of(group_names) -> str:
    """The one class group (group_data/<class>.py) an inventory puts a host in."""
    classes = [name for name in group_names if name in HOST_CLASSES]
    if len(classes) != 1:
        raise ValueError(f"a host must be in exactly one of the inventory groups {', '.join(HOST_CLASSES)}, "
                         f"found {classes or 'none'}")
    return classes[0]
