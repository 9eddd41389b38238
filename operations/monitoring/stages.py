"""The monitoring stages deploy.py calls."""

from operations.gateway.config import Gateway
from operations.gateway.membership import Worker
from operations.monitoring import prometheus
from operations.monitoring.prometheus import Monitoring


def monitoring_deployed(m: Monitoring, gateway_host_name: str, g: Gateway, workers: list[Worker]) -> None:
    """
    Prometheus on the gateway host: its arguments and targets written before the package (its first
    start listens where they say, confined), no key, its service, then every target checked up.

    **Example:**

    .. code:: python

        monitoring_deployed(m, host.name, g, membership.workers(fleet, host, g.model))
    """
    targets = prometheus.scrape_targets(gateway_host_name, g, workers)
    arguments = prometheus.arguments(name="Prometheus arguments", monitoring=m)
    config = prometheus.scrape_config(name="Prometheus targets", monitoring=m, targets=targets)
    confined = prometheus.confinement(name="Prometheus confinement")
    package = prometheus.package(name="Prometheus package")
    prometheus.no_scrape_key(name="Prometheus holds no key")
    unit = prometheus.service(name="Prometheus service", restart_when=[arguments, confined, package],
                              reload_when=[config])
    prometheus.targets_up(name="Prometheus targets up", monitoring=m, targets=targets, changed=[config, unit])
