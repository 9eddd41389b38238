"""Prometheus on gateway hosts: knobs, targets, configuration and the targets-up check, facts in and
commands out; the host script read on real answers of Debian's Prometheus 2.42 (tests/fixtures/prometheus)."""

import importlib.util
import json
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from pyinfra.api import FunctionCommand
from pyinfra.api.state import StateStage
from pyinfra.context import ctx_host, ctx_state

from deployment.gateway.config import resolve as resolve_gateway
from deployment.gateway.membership import Worker
from deployment.knobs import BadHostData
from operations.basics.file_states import FileStates
from operations.gateway import service
from operations.monitoring import prometheus
from operations.monitoring.prometheus import (KEY_FILE, PrometheusTargets, ScrapeTarget, config_text, down_targets,
                                   scrape_targets)
from operations.monitoring.prometheus import resolve as resolve_monitoring
from tests.unit.fakehost import FakeHost, failure, ran, run
from tests.unit.group_data import host_data

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "prometheus"
KEY = "lab-gateway-test-key"
AT_23_27_01 = datetime(2026, 11, 30, 23, 27, 1, tzinfo=timezone.utc).timestamp()  # the captures' lastScrape
WORKERS = [Worker("lab-pcie-1", "http://10.215.1.10:30000"), Worker("lab-b200-1", "http://10.215.2.10:30000")]


def host_script():
    path = Path(prometheus.__file__).parent / "host_scripts" / "prometheus_targets.py"
    spec = importlib.util.spec_from_file_location("prometheus_targets", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_prometheus_listens_on_loopback_unless_asked():
    m = resolve_monitoring(host_data("gateway"))
    assert (m.listen_address, m.port, m.api_address) == ("127.0.0.1", 9090, "127.0.0.1")
    assert 'ARGS="--web.listen-address=127.0.0.1:9090 --storage.tsdb.retention.time=15d"' \
        in prometheus.arguments_text(m).splitlines()
    assert resolve_monitoring(host_data("gateway", prometheus_listen_address="0.0.0.0")).api_address == "127.0.0.1"


@pytest.mark.parametrize("knob, value", [("prometheus_listen_address", "0.0.0.0 --web.enable-admin-api"),
                                         ("prometheus_retention", '15d" --web.enable-lifecycle "'),
                                         ("prometheus_port", 0), ("prometheus_port", "9090; id"),
                                         ("prometheus_scrape_interval_s", "fast"),
                                         ("prometheus_targets_timeout_s", -1)])
def test_a_value_that_would_reach_its_arguments_or_configuration_unchecked_is_refused(knob, value):
    with pytest.raises(BadHostData, match=knob):
        resolve_monitoring(host_data("gateway", **{knob: value}))


def test_targets_are_the_gateways_workers_at_their_addresses_and_smg_on_its_own_host():
    g = resolve_gateway(host_data("gateway", gateway_bind_address="0.0.0.0"))
    assert scrape_targets("gw", g, WORKERS) == [
        ScrapeTarget("sglang", "lab-pcie-1", "10.215.1.10:30000"), ScrapeTarget("sglang", "lab-b200-1", "10.215.2.10:30000"),
        ScrapeTarget("smg", "gw", "127.0.0.1:29000")]
    # smg's Prometheus port takes no key: it listens on loopback whatever the gateway's address.
    g = resolve_gateway(host_data("gateway", gateway_bind_address="10.0.0.5"))
    assert scrape_targets("gw", g, [])[-1] == ScrapeTarget("smg", "gw", "127.0.0.1:29000")
    args = g.args()
    assert args[args.index("--host") + 1] == "10.0.0.5" and args[args.index("--prometheus-host") + 1] == "127.0.0.1"


def test_configuration_scrapes_every_target_and_sends_no_key():
    """SGLang's /metrics takes no key (0.5.23 srt/utils/auth.py), so Prometheus holds none."""
    m = resolve_monitoring(host_data("gateway"))
    targets = scrape_targets("gw", resolve_gateway(host_data("gateway")), WORKERS)
    config = yaml.safe_load(config_text(m, targets))
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    assert config["global"]["scrape_interval"] == "15s"
    assert [(c["targets"], c["labels"]["host"]) for c in jobs["sglang"]["static_configs"]] == \
        [(["10.215.1.10:30000"], "lab-pcie-1"), (["10.215.2.10:30000"], "lab-b200-1")]
    assert [c["targets"] for c in jobs["smg"]["static_configs"]] == [["127.0.0.1:29000"]]
    assert not any("authorization" in job or "bearer_token_file" in job for job in jobs.values())


def test_an_earlier_deploys_scrape_key_is_removed_and_none_is_written(monkeypatch):
    monkeypatch.setenv("SPECFLEET_API_KEY", KEY)
    kept = {"kind": "file", "mode": "640", "user": "root", "group": "prometheus", "digest": "x"}
    assert run(prometheus.no_scrape_key, {FileStates: {KEY_FILE: kept}})[0] == [f"rm -f {KEY_FILE}"]
    assert run(prometheus.no_scrape_key, {FileStates: {KEY_FILE: None}})[0] == []


def test_prometheus_is_confined_beyond_debians_unit_by_a_drop_in():
    text = prometheus.render("monitoring/prometheus-confinement.conf.j2")
    assert prometheus.CONFINEMENT_FILE.startswith("/etc/systemd/system/prometheus.service.d/")
    for line in ("[Service]", "ProtectSystem=strict", "ReadWritePaths=/var/lib/prometheus", "ProtectProc=invisible",
                 "SystemCallFilter=@system-service", "SystemCallFilter=~@privileged",
                 "RestrictAddressFamilies=AF_INET AF_INET6 AF_UNIX"):
        assert f"\n{line}\n" in text, line


def test_the_host_script_reads_prometheus_targets_as_prometheus_2_42_answers(monkeypatch, capsys):
    script = host_script()
    answers = {name: json.loads((FIXTURES / f"{name}.json").read_text()) for name in ("targets-all-up", "targets-smg-down")}

    class Answer:
        def __init__(self, body):
            self.body = json.dumps(body).encode()

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def read(self):
            return self.body

    found = {}
    for name, body in answers.items():
        script.DIRECT.open = lambda url, timeout, body=body: Answer(body)
        found[name] = script.targets("127.0.0.1", "9090")
    assert found["targets-all-up"] == {"reachable": True, "targets": [
        {"job": "sglang", "instance": "10.215.1.10:30000", "health": "up", "error": "", "scraped_at": AT_23_27_01 + .945309041},
        {"job": "smg", "instance": "127.0.0.1:29000", "health": "up", "error": "", "scraped_at": AT_23_27_01 + .570519724}]}
    wanted = [ScrapeTarget("sglang", "lab-pcie-1", "10.215.1.10:30000"), ScrapeTarget("smg", "lab-gateway-1", "127.0.0.1:29000")]
    assert down_targets(found["targets-all-up"], wanted) == []
    assert down_targets(found["targets-smg-down"], wanted) == [
        'smg lab-gateway-1 (127.0.0.1:29000): down Get "http://127.0.0.1:29000/metrics": dial tcp 127.0.0.1:29000: '
        "connect: connection refused"]
    assert down_targets(found["targets-all-up"], [*wanted, ScrapeTarget("sglang", "new", "10.0.0.9:30000")]) == [
        "sglang new (10.0.0.9:30000): not a target"]
    assert down_targets({"reachable": False, "error": "connection refused"}, wanted) == [
        "Prometheus does not answer: connection refused"]
    # A worker that left the gateway's model (another profile) is no target once the deploy is done.
    assert down_targets(found["targets-all-up"], wanted[1:]) == [
        "sglang 10.215.1.10:30000: a target no worker of the gateway's model is"]

    # After a reload, Prometheus drops a target a moment later: the wait ends once it is gone.
    monkeypatch.setattr(script.time, "sleep", lambda seconds: None)
    dropping = iter([answers["targets-all-up"], {"status": "success", "data": {"activeTargets": [
        t for t in answers["targets-all-up"]["data"]["activeTargets"] if t["labels"]["job"] == "smg"]}}])
    script.DIRECT.open = lambda url, timeout: Answer(next(dropping))
    monkeypatch.setattr(sys, "argv", ["prometheus_targets.py", "127.0.0.1", "9090", "--until-up", "30",
                                      "smg=127.0.0.1:29000"])
    script.main()
    assert [t["job"] for t in json.loads(capsys.readouterr().out)["targets"]] == ["smg"]


class RecordingHost(FakeHost):
    """A FakeHost that also records the arguments of each fact it answers."""

    def __init__(self, facts):
        super().__init__(facts)
        self.asked = []

    def get_fact(self, fact_class, *args, **kwargs):
        self.asked.append(kwargs)
        return super().get_fact(fact_class)


def targets_up(facts: dict, stage: StateStage, changed: bool) -> tuple[list, RecordingHost]:
    fake = RecordingHost(facts)
    with ctx_host.use(fake), ctx_state.use(SimpleNamespace(current_stage=stage)):
        commands = list(prometheus.targets_up._inner(
            monitoring=resolve_monitoring(host_data("gateway")), targets=[ScrapeTarget("smg", "gw", "127.0.0.1:29000")],
            changed=[ran(changed)]))
    return commands, fake


def test_targets_up_checks_without_writing_when_all_are_up_as_scraped_after_the_workers_stages():
    up = {"reachable": True, "targets": [{"job": "smg", "instance": "127.0.0.1:29000", "health": "up", "error": ""}]}
    commands, fake = targets_up({PrometheusTargets: up}, StateStage.Prepare, changed=False)
    assert commands == [] and fake.noops == ["Prometheus scrapes its 1 targets, all up"]
    assert fake.asked == [{"address": "127.0.0.1", "port": 9090, "fresh_s": 0}]
    # Executed, it counts only scrapes made after it started: an interval (15 s), the scrape's timeout, slack.
    commands, fake = targets_up({PrometheusTargets: up}, StateStage.Execute, changed=False)
    assert commands == [] and fake.asked == [{"address": "127.0.0.1", "port": 9090, "fresh_s": 40}]


def test_targets_up_waits_for_the_targets_when_one_is_down_or_prometheus_changed():
    down = {"reachable": True, "targets": [{"job": "smg", "instance": "127.0.0.1:29000", "health": "down", "error": ""}]}
    for facts, changed in (({PrometheusTargets: down}, False), ({}, True)):
        commands, _ = targets_up(facts, StateStage.Execute, changed)
        assert len(commands) == 1 and isinstance(commands[0], FunctionCommand)


def test_the_gateways_key_is_removed_only_when_asked_and_never_from_an_exposed_gateway(monkeypatch):
    monkeypatch.delenv("SPECFLEET_API_KEY", raising=False)
    g = resolve_gateway(host_data("gateway"))
    present = {"kind": "file", "mode": "640", "user": "root", "group": "smg", "digest": "x"}
    commands, noops = run(service.api_key, {FileStates: {g.key_file: present}}, gateway=g)
    assert commands == [] and "kept (remove_api_key=true removes it)" in noops[0]
    removing = resolve_gateway(host_data("gateway", remove_api_key="true"))
    assert run(service.api_key, {FileStates: {g.key_file: present}}, gateway=removing)[0] == [f"rm -f {g.key_file}"]
    exposed = resolve_gateway(host_data("gateway", remove_api_key="true", gateway_bind_address="0.0.0.0"))
    [problem] = failure(run(service.api_key, {FileStates: {g.key_file: present}}, gateway=exposed)[0])
    assert problem == ("host-1: the gateway would listen on 0.0.0.0 without a key: set $SPECFLEET_API_KEY on the "
                       "controller or keep gateway_bind_address=127.0.0.1")


def test_the_host_script_takes_its_arguments_as_the_deploy_sends_them():
    """What _wait_up runs, against a port nothing listens on: an answer, not a usage error."""
    command = prometheus.inline("prometheus_targets", "127.0.0.1", "9", "--fresh", "0", "--until-up", "0",
                                "sglang=10.0.0.9:30000", "smg=127.0.0.1:29000")
    answer = subprocess.run(command, shell=True, capture_output=True, text=True, timeout=30)
    assert answer.returncode == 0, answer.stderr
    assert json.loads(answer.stdout)["reachable"] is False
