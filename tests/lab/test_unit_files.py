"""What the deploy writes into unit files reads back, as systemd parses it, as the value it was given."""

import dataclasses
import shlex

import pytest

from lab import fleet
from deployment.hosts import resolve
from operations.basics.templates import render
from operations.python import virtualenvs
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


def test_the_git_builds_unit_ends_what_a_build_leaves_running_and_keeps_its_home_read_only(lab_hosts, pcie_host):
    """The transient unit a git build runs in (virtualenvs.as_build_user), on a host's systemd: a process the build
    leaves behind ends with it, and of the build user's home only the build directory takes a write (a
    ~/.gitconfig or ~/.ssh/config there would run in every later build)."""
    user, home = virtualenvs.BUILD_USER, virtualenvs.BUILD_HOME
    fleet.ssh(pcie_host, f"id {user} >/dev/null 2>&1 || useradd --system --create-home --home-dir {home} "
                         f"--shell /usr/sbin/nologin {user}")
    build = ("setsid sleep 300 </dev/null >/dev/null 2>&1 & "
             f"if touch {home}/.gitconfig 2>/dev/null; then echo home-written; fi; "
             f"touch {virtualenvs.BUILD_DIR}/built && echo build-dir-written")
    try:
        said = fleet.ssh(pcie_host, f"{virtualenvs.as_build_user(build)}; sleep 1; "
                                    f"pgrep -u {user} sleep >/dev/null && echo left-running || echo none-left")
        assert said.split() == ["build-dir-written", "none-left"], said
    finally:
        fleet.ssh(pcie_host, f"pkill -u {user}; userdel -r {user} 2>/dev/null; true")
