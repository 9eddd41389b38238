"""Prometheus on one gateway host (group_data/gateway.py `prometheus_*`): typed, every value checked through
its knob (operations/monitoring/prometheus.py installs and configures it)."""

from dataclasses import dataclass
from typing import Any

from deployment import network, schema


@dataclass(frozen=True)
class Monitoring:
    """Prometheus on one gateway host (group_data/gateway.py `prometheus_*`), resolved and validated."""

    listen_address: str = schema.knob("prometheus_listen_address")
    port: int = schema.knob("prometheus_port")
    scrape_interval_s: int = schema.knob("prometheus_scrape_interval_s")
    retention: str = schema.knob("prometheus_retention")
    targets_timeout_s: int = schema.knob("prometheus_targets_timeout_s")

    @property
    def api_address(self) -> str:
        """Where the deploy and the checks reach its API on its own host."""
        return network.local_address(self.listen_address)


def resolve(data: Any) -> Monitoring:
    """A gateway host's Prometheus knobs as the typed, validated `Monitoring` (they reach its argument
    and configuration files); a bad value raises BadHostData naming the knob, the value and what is accepted."""
    return Monitoring(**schema.knob_fields(data, Monitoring))
