"""uninstall.py: what it removes, from the host's resolved data and what a Leftovers fact found."""

import pytest

from operations import status, uninstall
from operations.basics.knobs import BadHostData
from operations.deployment import resolve_worker
from operations.monitoring import prometheus
from tests.unit.group_data import host_data
from tests.unit.test_gateway import inventory_host

WEIGHTS = "/srv/specfleet/models"


def planned(name: str, groups: list[str], remove_weights: bool = False, **data) -> uninstall.Uninstall:
    host = inventory_host(name, groups, **data)
    view = status.view_of(host, [host])
    return uninstall.plan(view.service, view.gateway, WEIGHTS, remove_weights)


def test_a_worker_loses_its_download_units_user_home_and_directories_and_keeps_its_weights():
    u = planned("pcie-1", ["rtx_pro_6000_pcie"])
    # The download user goes too, with its home: the HF token is in it.
    assert u.directories == ("/etc/specfleet", "/opt/specfleet") and u.users == ("sglang", "sglang-download", "specfleet-build")
    assert u.gateway_unit is None and u.weights_dir is None
    paths, users = uninstall.candidates(u)
    assert WEIGHTS not in paths and users == ("sglang", "sglang-download", "specfleet-build")
    left = {"paths": ["/etc/specfleet", "/opt/specfleet"], "users": ["sglang", "sglang-download"],
            "units": ["specfleet-weights-moonshotai--Kimi-K2.6"]}
    assert uninstall.removals(u, left) == [
        "systemctl disable --now specfleet-weights-moonshotai--Kimi-K2.6.service",
        "rm -f -- /etc/systemd/system/specfleet-weights-moonshotai--Kimi-K2.6.service",
        "systemctl daemon-reload",
        "systemctl reset-failed specfleet-weights-moonshotai--Kimi-K2.6.service 2>/dev/null || true",
        "userdel --remove sglang 2>/dev/null || userdel sglang",
        "userdel --remove sglang-download 2>/dev/null || userdel sglang-download",
        "rm -rf -- /etc/specfleet /opt/specfleet"]
    # Nothing left: nothing to run (a second uninstall changes nothing).
    assert uninstall.removals(u, {"paths": [], "users": [], "units": []}) == []


def test_the_view_holds_the_hosts_service_level_which_uninstall_and_status_read():
    """uninstall.py retires the units and status reads them with the host's ServiceHost, the level that owns
    the unit prefix, keys and users; a gateway without GPUs has none."""
    worker = inventory_host("pcie-1", ["rtx_pro_6000_pcie"])
    view = status.view_of(worker, [worker])
    assert view.service == resolve_worker(worker.data, "rtx_pro_6000_pcie")[0].service
    assert status.wanted(view)[0][1] == dict(prefix="sglang", key_file="/etc/specfleet/api-key", service_user="sglang")
    gateway = inventory_host("gw", ["gateway"], **vars(host_data("gateway")))
    assert status.view_of(gateway, [gateway]).service is None


def test_a_gateway_loses_smg_and_prometheus_targets_and_the_weights_go_only_when_asked():
    u = planned("gw-1", ["gateway"], remove_weights=True)
    assert u.users == ("smg", "specfleet-build") and u.gateway_unit == "/etc/systemd/system/smg.service" and u.weights_dir == WEIGHTS
    left = {"paths": [u.gateway_unit, prometheus.CONFINEMENT_FILE, prometheus.CONFIG_FILE, WEIGHTS, "/opt/specfleet"],
            "users": ["smg"], "units": []}
    commands = uninstall.removals(u, left)
    assert commands[:2] == ["systemctl disable --now smg.service", "rm -f -- /etc/systemd/system/smg.service"]
    assert f"systemctl disable --now {prometheus.SERVICE}" in commands
    assert f"rm -f -- {prometheus.CONFINEMENT_FILE} {prometheus.CONFIG_FILE}" in commands
    assert commands[-1] == f"rm -rf -- /opt/specfleet {WEIGHTS}"
    # Prometheus not the deploy's (no confinement file of its): left alone.
    assert not any("prometheus" in c for c in uninstall.removals(u, {**left, "paths": [prometheus.CONFIG_FILE]}))


@pytest.mark.parametrize("knob, value", [("install_dir", "/opt"), ("config_dir", "/etc")])
def test_a_directory_of_one_component_is_never_removed_whole(knob, value):
    with pytest.raises(BadHostData, match=f"{value!r} is not removed whole"):
        planned("pcie-1", ["rtx_pro_6000_pcie"], **{knob: value})
    host = inventory_host("pcie-1", ["rtx_pro_6000_pcie"])
    view = status.view_of(host, [host])
    with pytest.raises(BadHostData, match="weights_dir='/srv' is not removed whole"):
        uninstall.plan(view.service, None, "/srv", True)
    assert uninstall.plan(view.service, None, "/srv", False).weights_dir is None  # kept: nothing refused


def test_a_host_with_nothing_left_answers_an_empty_leftovers():
    assert uninstall.Leftovers().process([]) == uninstall.Leftovers.default() == {"paths": [], "users": [], "units": []}
