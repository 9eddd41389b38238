"""Prometheus on the `gateway` group's hosts: Debian's own package, scraping the gateway's workers and smg.

Its targets come from the inventory, as the gateway's workers do (``membership.workers``): every
worker of the gateway's model at the address the gateway reaches it (`/metrics`, which SGLang
serves without its API key, so Prometheus holds none), and smg's own Prometheus port. The deploy
then asks Prometheus (`/api/v1/targets`) whether every target is up, and fails the host naming
those that are not.

Prometheus has no key of its own, so it listens on loopback unless `prometheus_listen_address`
says otherwise; its arguments, configuration and confinement (a drop-in to Debian's unit) are
written before the package is installed, so even its first start (the package's postinst starts
it) listens only there, confined.
"""

import json
import posixpath
import time
from dataclasses import dataclass
from io import StringIO
from typing import Any
from urllib.parse import urlsplit

from pyinfra import host, state
from pyinfra.api import FactBase, FunctionCommand, StringCommand, operation
from pyinfra.api.operation import OperationMeta
from pyinfra.api.state import StateStage
from pyinfra.operations import files, systemd

from deployment import network, schema
from deployment.gateway.config import Gateway
from deployment.gateway.membership import Worker
from operations.basics import apt_packages, gathering, shell
from operations.basics.file_states import FileStates
from operations.basics.host_programs import inline
from operations.basics.templates import render
from operations.basics.units import any_change
from operations.basics.untrusted import printable

PACKAGE = "prometheus"  # Debian's (bookworm: 2.42), its unit runs `/usr/bin/prometheus $ARGS` as `prometheus`
SERVICE = "prometheus.service"
USER = "prometheus"  # made by the package's postinst
ARGUMENTS_FILE = "/etc/default/prometheus"  # the package's EnvironmentFile: ARGS
CONFIG_FILE = "/etc/prometheus/prometheus.yml"  # the package's default --config.file
# Where earlier deploys gave Prometheus the workers' key: removed, as SGLang's /metrics takes none
# (0.5.23 srt/utils/auth.py: /health, /ready and /metrics are always allowed).
KEY_FILE = "/etc/prometheus/specfleet-api-key"
# Confinement beyond Debian's unit: `systemd-analyze security` rates it at most 3.0 with it
# (tests/deployed/test_gateway.py), 3.9 without.
CONFINEMENT_FILE = "/etc/systemd/system/prometheus.service.d/specfleet-confinement.conf"


@dataclass(frozen=True)
class Monitoring:
    """Prometheus on one gateway host (group_data/gateway.py `prometheus_*`), resolved and validated."""

    listen_address: str
    port: int
    scrape_interval_s: int
    retention: str
    targets_timeout_s: int

    @property
    def api_address(self) -> str:
        """Where the deploy and the checks reach its API on its own host."""
        return network.local_address(self.listen_address)


def resolve(data: Any) -> Monitoring:
    """A gateway host's Prometheus knobs as the typed, validated `Monitoring` (they reach its argument
    and configuration files); a bad value raises BadHostData naming the knob, the value and what is accepted."""
    return Monitoring(
        listen_address=schema.value(data, "prometheus_listen_address"),
        port=schema.value(data, "prometheus_port"),
        scrape_interval_s=schema.value(data, "prometheus_scrape_interval_s"),
        retention=schema.value(data, "prometheus_retention"),
        targets_timeout_s=schema.value(data, "prometheus_targets_timeout_s"),
    )


@dataclass(frozen=True)
class ScrapeTarget:
    job: str  # `sglang` (a worker's /metrics) or `smg` (the gateway's Prometheus port)
    name: str  # the inventory host it belongs to (label `host`)
    address: str  # host:port, Prometheus's `instance`
    replica: str = ""  # a worker's SGLang unit on that host (label `replica`)


def scrape_targets(gateway_host_name: str, gateway: Gateway, workers: list[Worker]) -> list[ScrapeTarget]:
    """What Prometheus scrapes: each worker at the address the gateway reaches it, and smg."""
    return [*(ScrapeTarget("sglang", w.name, urlsplit(w.url).netloc, w.replica) for w in workers),
            ScrapeTarget("smg", gateway_host_name, f"{gateway.prometheus_address}:{gateway.prometheus_port}")]


def config_text(monitoring: Monitoring, targets: list[ScrapeTarget]) -> str:
    return render("monitoring/prometheus.yml.j2", m=monitoring, targets=targets)


def arguments_text(monitoring: Monitoring) -> str:
    return render("monitoring/prometheus.default.j2", m=monitoring)


@operation()
def arguments(monitoring: Monitoring):
    """
    Prometheus's arguments in Debian's ``/etc/default/prometheus`` (listen address, retention).
    Written before the package: its first start already listens where this says.

    + monitoring: the host's resolved Prometheus knobs

    **Example:**

    .. code:: python

        monitoring.arguments(name="Prometheus arguments", monitoring=m)
    """
    yield from shell.put(src=StringIO(arguments_text(monitoring)), dest=ARGUMENTS_FILE, mode="644",
                                user="root", group="root")


@operation()
def scrape_config(monitoring: Monitoring, targets: list[ScrapeTarget]):
    """
    Prometheus's configuration: the inventory's workers and the gateway's smg as scrape targets.
    It holds no key: SGLang's /metrics takes none.

    + monitoring: the host's resolved Prometheus knobs
    + targets: what it scrapes (`scrape_targets()`)

    **Example:**

    .. code:: python

        monitoring.scrape_config(name="Prometheus targets", monitoring=m, targets=scrape_targets(host.name, g, w))
    """
    yield from files.directory._inner(path="/etc/prometheus", mode="755", user="root", group="root")
    yield from shell.put(src=StringIO(config_text(monitoring, targets)),
                                dest=CONFIG_FILE, mode="644", user="root", group="root")


@operation()
def package():
    """
    Debian's ``prometheus`` package, without its Recommends (the node exporter); the package
    lists are updated only when apt does not know it.

    **Example:**

    .. code:: python

        monitoring.package(name="Prometheus package")
    """
    yield from apt_packages.install([PACKAGE])


@operation()
def no_scrape_key():
    """
    No workers' key on the Prometheus host: SGLang's /metrics takes none, so Prometheus sends none
    (an earlier deploy's key file is removed).

    **Example:**

    .. code:: python

        monitoring.no_scrape_key(name="Prometheus holds no key")
    """
    if gathering.read(FileStates, paths=(KEY_FILE,)).get(KEY_FILE):
        yield StringCommand("rm", "-f", KEY_FILE)
    else:
        host.noop(f"{KEY_FILE} is absent")


@operation()
def confinement():
    """
    A drop-in to Debian's Prometheus unit confining it further (templates/monitoring/prometheus-confinement.conf.j2).
    Written before the package, so the package's first start is already confined.

    **Example:**

    .. code:: python

        monitoring.confinement(name="Prometheus confinement")
    """
    yield from files.directory._inner(path=posixpath.dirname(CONFINEMENT_FILE), mode="755", user="root", group="root")
    yield from shell.put(src=StringIO(render("monitoring/prometheus-confinement.conf.j2")),
                                dest=CONFINEMENT_FILE, mode="644", user="root", group="root")


@operation()
def service(restart_when: list[OperationMeta], reload_when: list[OperationMeta]):
    """
    Prometheus enabled and running: restarted when its arguments or package changed, reloaded
    (SIGHUP, which re-reads the configuration) when only its targets did.

    + restart_when: operations whose change needs a restart
    + reload_when: operations whose change needs a reload

    **Example:**

    .. code:: python

        monitoring.service(name="Prometheus service", restart_when=[args, pkg], reload_when=[config])
    """
    restart = any_change(restart_when)
    yield from systemd.service._inner(service=SERVICE, running=True, enabled=True, restarted=restart,
                                      reloaded=not restart and any_change(reload_when),
                                      daemon_reload=restart)


class PrometheusTargets(FactBase):
    """
    Prometheus's scrape targets (`/api/v1/targets`, host_scripts/prometheus_targets.py); with `fresh_s`,
    as scraped after the command started (it waits up to that long for each target's next scrape).

    .. code:: python

        {"reachable": True, "targets": [{"job": "sglang", "instance": "10.213.1.10:30000",
                                         "health": "up", "error": "", "scraped_at": 1796081256.6}]}
    """

    def command(self, address: str, port: int, fresh_s: int = 0) -> str:
        return inline("prometheus_targets", address, str(port), "--fresh", str(fresh_s))

    def process(self, output):
        try:
            return json.loads(output[-1])
        except (IndexError, ValueError):
            return {"reachable": False, "targets": [], "error": " ".join(output)[-200:]}


def fresh_scrape_s(monitoring: Monitoring) -> int:
    """How long the next scrape of every target may take: an interval, its timeout (Prometheus's 10 s), slack."""
    return 2 * monitoring.scrape_interval_s + 10


def down_targets(found: dict, wanted: list[ScrapeTarget]) -> list[str]:
    """Each wanted target that Prometheus does not report `up`, with why, and each target it scrapes that is not
    wanted (a worker that left the inventory or serves another model); empty when the targets are the wanted
    ones, all up."""
    if not found.get("reachable"):
        return [f"Prometheus does not answer: {printable(found.get('error', ''))}"]
    health = {(t["job"], t["instance"]): t for t in found["targets"]}
    listed = {(t.job, t.address) for t in wanted}
    down = [f"{printable(job)} {printable(instance)}: a target no worker of the gateway's model is"
            for job, instance in sorted(health) if (job, instance) not in listed]
    for target in wanted:
        seen = health.get((target.job, target.address))
        if seen is None:
            down.append(f"{target.job} {target.name} ({target.address}): not a target")
        elif seen["health"] != "up":
            down.append(f"{target.job} {target.name} ({target.address}): {printable(seen['health'])} {printable(seen['error'])}".rstrip())
    return down


@operation()
def targets_up(monitoring: Monitoring, targets: list[ScrapeTarget], changed: list[OperationMeta]):
    """
    Every scrape target up in Prometheus, else the host fails naming the targets that are down.
    After a change (or when one is down now) it waits for their scrapes, up to `prometheus_targets_timeout_s`.

    + monitoring: the host's resolved Prometheus knobs
    + targets: what Prometheus should scrape (`scrape_targets()`)
    + changed: Prometheus's operations (a change means fresh scrapes to wait for)

    **Example:**

    .. code:: python

        monitoring.targets_up(name="Prometheus targets up", monitoring=m, targets=t, changed=[config, svc])
    """
    if not any_change(changed):
        # Run again at execution, after the workers' stages: then only scrapes made from now on count,
        # never one from before a worker restarted in this run.
        executing = state.current_stage == StateStage.Execute
        found = host.get_fact(PrometheusTargets, address=monitoring.api_address, port=monitoring.port,
                              fresh_s=fresh_scrape_s(monitoring) if executing else 0)
        if not down_targets(found, targets):
            host.noop(f"Prometheus scrapes its {len(targets)} targets, all up")
            return
    yield FunctionCommand(_wait_up, (monitoring, targets), {})


def _wait_up(state, host, monitoring: Monitoring, targets: list[ScrapeTarget]) -> bool:
    """At execution time, after the gateway's stage: poll Prometheus until every target is up."""
    command = inline("prometheus_targets", monitoring.api_address, str(monitoring.port),
                     "--fresh", str(fresh_scrape_s(monitoring)), "--until-up", str(monitoring.targets_timeout_s),
                     *(f"{t.job}={t.address}" for t in targets))
    started = time.monotonic()
    ok, output = shell.run(host, command)
    found = PrometheusTargets().process(output.stdout_lines) if ok else {"reachable": False, "error": output.stderr}
    down = down_targets(found, targets)
    if down:
        host.log_styled(f"Prometheus targets down after {time.monotonic() - started:.0f} s: " + "; ".join(down),
                        fg="red")
        return False
    host.log_styled(f"Prometheus: {len(targets)} targets up ({time.monotonic() - started:.1f} s)", fg="green")
    return True

