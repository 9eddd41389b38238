"""The monitoring stages deploy.py calls."""

from deployment.gateway.config import Gateway
from deployment.gateway.membership import Worker
from operations.monitoring import prometheus
from operations.monitoring.prometheus import Monitoring


def monitoring_deployed(monitoring: Monitoring, gateway_host_name: str, gateway: Gateway,
                        workers: list[Worker]) -> None:
    """
    Prometheus on the gateway host: its arguments and targets written before the package (its first
    start listens where they say, confined), no key, its service, then every target checked up.

    **Example:**

    .. code:: python

        monitoring_deployed(monitoring, host.name, gateway, membership.workers(fleet, host, gateway.model))
    """
    targets = prometheus.scrape_targets(gateway_host_name, gateway, workers)
    arguments = prometheus.arguments(name="Prometheus arguments", monitoring=monitoring)
    config = prometheus.scrape_config(name="Prometheus targets", monitoring=monitoring, targets=targets)
    confined = prometheus.confinement(name="Prometheus confinement")
    package = prometheus.package(name="Prometheus package")
    prometheus.no_scrape_key(name="Prometheus holds no key")
    unit = prometheus.service(name="Prometheus service", restart_when=[arguments, confined, package],
                              reload_when=[config])
    prometheus.targets_up(name="Prometheus targets up", monitoring=monitoring, targets=targets, changed=[config, unit])
