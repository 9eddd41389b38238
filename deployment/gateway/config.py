"""One gateway host's smg (group_data/gateway.py): typed, every value checked through knobs."""

import re
from dataclasses import dataclass
from typing import Any

from deployment import knobs, network, schema
from deployment.server.config import served_model_name

# The smg releases whose worker listing the sync reads (host_scripts/gateway_workers.py, SUPPORTED): a pin to
# another smg release is refused before anything is installed; a path or URL requirement is judged by the
# listing it answers.
SMG_PIN = re.compile(r"\s*smg\s*===?\s*(?P<version>[^\s;,]+)\s*$", re.IGNORECASE)
SUPPORTED_SMG = re.compile(r"1\.13(\.\d+)*")
ENDPOINT = re.compile(r"/[A-Za-z0-9_./-]*")
HEALTH_KEYS = ("endpoint", "interval_secs", "timeout_secs", "failure_threshold", "success_threshold")


@dataclass(frozen=True)
class Gateway:
    """What one gateway host runs (group_data/gateway.py), resolved and validated."""

    model: str  # the served model name of the host's profile: its workers serve the same
    requirement: str
    service_name: str
    user: str
    bind_address: str
    port: int
    prometheus_port: int
    policy: str
    health: dict[str, Any]
    register_timeout_s: int
    install_dir: str
    config_dir: str
    pip_index_url: str | None
    api_key_env: str  # the clients' key (smg --api-key), which smg forwards to the workers: theirs too
    admin_key_env: str  # the control plane's key (smg --control-plane-api-keys): registers and removes workers
    remove_api_key: bool  # only this removes the gateway's keys (as the workers', `remove_api_key`)

    @property
    def venv(self) -> str:
        return f"{self.install_dir}/smg-venv"

    @property
    def home(self) -> str:
        return f"/var/lib/{self.service_name}"

    @property
    def key_file(self) -> str:
        return f"{self.config_dir}/{self.service_name}-api-key"

    @property
    def admin_key_file(self) -> str:
        return f"{self.config_dir}/{self.service_name}-admin-key"

    @property
    def local_address(self) -> str:
        """Where the gateway's own host reaches its API."""
        return network.local_address(self.bind_address)

    @property
    def unit_file(self) -> str:
        return f"/etc/systemd/system/{self.service_name}.service"

    @property
    def script(self) -> str:
        return f"{self.install_dir}/bin/gateway_workers.py"

    @property
    def exposed(self) -> bool:
        return not network.is_loopback(self.bind_address)

    @property
    def prometheus_address(self) -> str:
        """Where smg's Prometheus port listens: loopback, whatever the gateway's bind address, as it
        takes no key (smg's --prometheus-host otherwise defaults to the unspecified address of
        --host's family); Prometheus scrapes it on the same host."""
        return network.LOOPBACK

    def args(self) -> list[str]:
        """smg launch's arguments (the API key is added on the host by launch_smg.py)."""
        h = self.health
        return ["--host", self.bind_address, "--port", str(self.port), "--policy", self.policy,
                "--prometheus-host", self.prometheus_address, "--prometheus-port", str(self.prometheus_port),
                "--health-check-endpoint", h["endpoint"],
                "--health-check-interval-secs", str(h["interval_secs"]),
                "--health-check-timeout-secs", str(h["timeout_secs"]),
                "--health-failure-threshold", str(h["failure_threshold"]),
                "--health-success-threshold", str(h["success_threshold"]),
                "--worker-startup-timeout-secs", str(self.register_timeout_s)]


def resolve(data: Any) -> Gateway:
    """A gateway host's data as the typed, validated `Gateway` (every value reaches a unit file or a
    shell line); a bad value raises BadHostData naming the knob, the value and what is accepted."""
    health = data.gateway_health
    if not isinstance(health, dict) or set(health) != set(HEALTH_KEYS):
        raise knobs.refused("gateway_health", health, f"use dict({', '.join(HEALTH_KEYS)})")

    requirement = schema.value(data, "gateway_requirement")
    pin = SMG_PIN.match(requirement)
    if pin and not SUPPORTED_SMG.fullmatch(pin["version"]):
        raise knobs.refused("gateway_requirement", requirement, "use smg==1.13.0 (the worker sync reads smg "
                            "1.13's listing; later smg lists no worker `status`)",
                            wrong="is an smg release the sync does not read")
    return Gateway(
        model=served_model_name(data),
        requirement=requirement,
        service_name=schema.value(data, "gateway_service_name"),
        user=schema.value(data, "gateway_user"),
        bind_address=schema.value(data, "gateway_bind_address"),
        port=schema.value(data, "gateway_port"),
        prometheus_port=schema.value(data, "gateway_prometheus_port"),
        policy=schema.value(data, "gateway_policy"),
        health={"endpoint": knobs.matching("gateway_health['endpoint']", health["endpoint"], ENDPOINT,
                                           "a path such as /health"),
                **{k: knobs.integer(f"gateway_health[{k!r}]", health[k], minimum=1) for k in HEALTH_KEYS[1:]}},
        register_timeout_s=schema.value(data, "gateway_register_timeout_s"),
        install_dir=schema.value(data, "install_dir"),
        config_dir=schema.value(data, "config_dir"),
        pip_index_url=schema.value(data, "pip_index_url"),
        api_key_env=schema.value(data, "api_key_env"),
        admin_key_env=schema.value(data, "gateway_admin_key_env"),
        remove_api_key=schema.value(data, "remove_api_key"),
    )
