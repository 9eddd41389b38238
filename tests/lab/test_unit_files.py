"""What the deploy writes into unit files reads back, as systemd parses it, as the value it was given."""

import dataclasses
import shlex

import pytest

from lab import fleet
from operations.basics.templates import render
from operations.deployment import resolve
from operations.server import unit
from tests.unit.group_data import host_data

pytestmark = pytest.mark.lab

ENDPOINT = "http://10.0.0.1:8860/hub%2Fmirror/%25a"  # a %-encoded path: % is also systemd's specifier
TEMPLATE_ARG = "/opt/templates/chat%2Fkimi.jinja"


def installed(host, name: str, text: str, *properties: str) -> str:
    """`text` as the unit NAME on the host (never started), what systemctl shows of it, and its load log."""
    quoted = shlex.quote(text)
    try:
        return fleet.ssh(host, f"printf %s {quoted} > /etc/systemd/system/{name}.service && systemctl daemon-reload && "
                               f"systemctl show {name} {' '.join(f'-p {p}' for p in properties)}")
    finally:
        fleet.ssh(host, f"rm -f /etc/systemd/system/{name}.service && systemctl daemon-reload")


def test_a_percent_in_a_value_reaches_the_unit_as_written(lab_hosts, pcie_host):
    d = resolve(host_data("rtx_pro_6000_pcie", lab=True, hf_endpoint=ENDPOINT), "rtx_pro_6000_pcie")
    repo = d.weights.target
    weights_unit = render("weights/weights.service.j2", w=d.weights, repo=repo, commit="a" * 40,
                          spec_file="/etc/specfleet/weights-target.json")
    shown = installed(pcie_host, "specfleet-test-weights", weights_unit, "Environment")
    assert f"HF_ENDPOINT={ENDPOINT}" in shown.split(), shown

    server = dataclasses.replace(d.replicas[0], engine=dataclasses.replace(
        d.engine, extra_args=(*d.engine.extra_args, "--chat-template", TEMPLATE_ARG)))
    unit_text, _ = unit.unit_files(server, "inputs", ())
    shown = installed(pcie_host, "specfleet-test-sglang", unit_text, "ExecStart")
    assert f"--chat-template {TEMPLATE_ARG} " in shown, shown
