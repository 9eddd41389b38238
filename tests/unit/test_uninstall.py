"""uninstall.py: what it removes, from the host's resolved data and what a Leftovers fact found."""

import os
import pwd
import subprocess

import pytest

from deployment.hosts import resolve_worker
from deployment.knobs import BadHostData
from operations import status, uninstall
from operations.basics import ownership
from operations.monitoring import prometheus
from tests.unit.group_data import host_data
from tests.unit.test_gateway import inventory_host

WEIGHTS = "/srv/specfleet/models"


def planned(name: str, groups: list[str], remove_weights: bool = False, **data) -> uninstall.Uninstall:
    host = inventory_host(name, groups, **data)
    view = status.view_of(host, [host])
    return uninstall.plan(view.service, view.gateway, WEIGHTS, remove_weights, view.replicas)


def account(home: str, marked: bool = True, uid: int = 990, shell: str = "/usr/sbin/nologin") -> dict:
    return {"uid": uid, "home": home, "shell": shell, "marked": marked}


def deployed(u: uninstall.Uninstall, **more) -> dict:
    """A Leftovers fact of a host the deploy converged: every named directory and account there, marked."""
    return {**uninstall.Leftovers.default(), "paths": list(u.directories), "marked": list(u.directories),
            "accounts": {user: account(home) for user, home in u.users}, **more}


def test_a_worker_loses_its_download_units_users_homes_and_directories_and_keeps_its_weights():
    u = planned("pcie-1", ["rtx_pro_6000_pcie"])
    assert u.directories == ("/etc/specfleet", "/opt/specfleet") and u.peer_dir == "/etc/specfleet-weights-peer"
    # The download user goes too, with its home: the HF token is in it.
    assert u.users == (("sglang", "/home/sglang"), ("sglang-download", "/home/sglang-download"))
    assert u.gateway_unit is None and not u.remove_weights
    asked = uninstall.asked(u)
    assert WEIGHTS not in asked["paths"] and "weights_dir" not in asked and asked["users"] == ("sglang", "sglang-download")
    left = deployed(u, units=["specfleet-weights-moonshotai--Kimi-K2.6"])
    left["accounts"]["specfleet-build"] = account("/home/specfleet-build")  # found by its mark, named by nothing
    assert uninstall.problem(u, left) is None
    assert uninstall.removals(u, left) == [
        "systemctl disable --now specfleet-weights-moonshotai--Kimi-K2.6.service",
        "rm -f -- /etc/systemd/system/specfleet-weights-moonshotai--Kimi-K2.6.service",
        "systemctl daemon-reload",
        "systemctl reset-failed specfleet-weights-moonshotai--Kimi-K2.6.service 2>/dev/null || true",
        "userdel --remove sglang 2>/dev/null || userdel sglang",
        "userdel --remove sglang-download 2>/dev/null || userdel sglang-download",
        "userdel --remove specfleet-build 2>/dev/null || userdel specfleet-build",
        "rm -rf -- /etc/specfleet /opt/specfleet"]
    assert uninstall.summary(u, left, "sglang") == (
        "Remove every SGLang unit (sglang, sglang@*); the units specfleet-weights-moonshotai--Kimi-K2.6; the accounts "
        "sglang, sglang-download, specfleet-build with their homes; the directories /etc/specfleet, /opt/specfleet; "
        f"the weights in {WEIGHTS} stay (remove_weights=true removes them)")
    # Nothing left: nothing to run (a second uninstall changes nothing).
    assert uninstall.removals(u, uninstall.Leftovers.default()) == []


@pytest.mark.parametrize("data, found, refusal", [
    # Debian's postgres: a system user with a login shell and a home of its own.
    (dict(service_user="postgres"), {"postgres": account("/var/lib/postgresql", False, 114, "/bin/bash")},
     "the account postgres has the login shell /bin/bash; the deploy would take it over"),
    (dict(service_user="www-data"), {"www-data": account("/var/www", False, 33)},
     "the account www-data has the home /var/www, not /home/www-data"),
    # A system user as the deploy would make one, but not made by it (no mark): not the deploy's to remove.
    (dict(download_user="mirror"), {"mirror": account("/home/mirror", False)},
     "the account mirror carries no comment 'specfleet'"),
])
def test_an_account_the_host_data_names_that_is_not_the_deploys_refuses_the_host_removing_nothing(data, found,
                                                                                                   refusal):
    u = planned("pcie-1", ["rtx_pro_6000_pcie"], **data)
    left = deployed(u)
    left["accounts"].update(found)
    why = uninstall.problem(u, left)
    assert why.startswith(refusal) and "uninstall removes nothing" in why and "\n" not in why


def test_a_directory_without_the_deploys_mark_refuses_the_host_removing_nothing():
    u = planned("pcie-1", ["rtx_pro_6000_pcie"], config_dir="/etc/ssl")
    left = deployed(u)
    left["marked"] = [d for d in u.directories if d != "/etc/ssl"]
    assert "/etc/ssl" in left["paths"]
    assert uninstall.problem(u, left).startswith("/etc/ssl holds no .specfleet, the mark the deploy writes")
    # Absent, it refuses nothing: there is nothing to remove.
    assert uninstall.problem(u, {**left, "paths": ["/opt/specfleet"]}) is None


def test_a_deployments_user_an_earlier_layout_left_goes_by_its_mark_and_an_unmarked_account_stays():
    u = planned("pcie-1", ["rtx_pro_6000_pcie"])  # one deployment now: no sglang-kimi in its data
    left = deployed(u)
    left["accounts"].update({"sglang-kimi": account("/home/sglang-kimi"), "backup": account("/home/backup", False)})
    commands = uninstall.removals(u, left)
    assert "userdel --remove sglang-kimi 2>/dev/null || userdel sglang-kimi" in commands
    assert not any("backup" in c for c in commands)


def test_the_fanouts_nginx_is_purged_then_unmasked_only_where_the_deploy_installed_it():
    u = planned("pcie-1", ["rtx_pro_6000_pcie"])
    left = deployed(u, nginx=["nginx", "nginx-common"], nginx_masked=True)
    left["paths"].append(u.peer_dir)
    left["marked"].append(u.peer_dir)
    commands = uninstall.removals(u, left)
    purge = commands.index("DEBIAN_FRONTEND=noninteractive apt-get purge -y -q nginx nginx-common")
    assert commands[purge + 1] == "systemctl unmask nginx.service"
    assert commands[-1] == "rm -rf -- /etc/specfleet /opt/specfleet /etc/specfleet-weights-peer"
    # An earlier deploy's peer directory without the mark stays, and refuses nothing.
    unmarked = {**left, "marked": left["marked"][:-1]}
    assert uninstall.problem(u, unmarked) is None and uninstall.removals(u, unmarked)[-1] == \
        "rm -rf -- /etc/specfleet /opt/specfleet"
    # A site's own nginx: not masked, or no fan-out directory of the deploy's.
    assert not any("nginx" in c for c in uninstall.removals(u, {**left, "nginx_masked": False}))
    assert not any("nginx" in c for c in uninstall.removals(u, unmarked))


def test_the_weights_go_only_when_asked_deleted_by_their_owner_before_it_goes():
    u = planned("pcie-1", ["rtx_pro_6000_pcie"], remove_weights=True)
    assert uninstall.asked(u)["weights_dir"] == WEIGHTS and uninstall.asked(u)["owner"] == "sglang-download"
    repos = [f"{WEIGHTS}/moonshotai--Kimi-K2.6", f"{WEIGHTS}/z-lab--Kimi-K2.6-DFlash"]
    commands = uninstall.removals(u, deployed(u, weights=repos))
    delete = commands.index(f"cd / && runuser -u sglang-download -- find {' '.join(repos)} -mindepth 1 -delete")
    assert commands[delete + 1:delete + 3] == [f"rmdir -- {' '.join(repos)}", f"rmdir -- {WEIGHTS} 2>/dev/null || true"]
    assert delete < commands.index("userdel --remove sglang-download 2>/dev/null || userdel sglang-download")
    assert not any(WEIGHTS in c for c in commands if "runuser" not in c and not c.startswith("rmdir"))  # no rm as root
    assert uninstall.summary(u, deployed(u, weights=repos), "sglang").split("; ")[1] == f"the weights in {WEIGHTS}"
    assert not any(WEIGHTS in c for c in uninstall.removals(u, deployed(u)))  # none of the owner's left: no command


def test_leftovers_reads_marks_accounts_and_units_as_the_host_shows_them(tmp_path):
    """The fact's own command, run here: a directory holding root's mark, one without, one whose mark is a link."""
    for name in ("marked", "unmarked", "linked"):
        (tmp_path / name).mkdir()
    (tmp_path / "marked" / ownership.DIRECTORY_MARK).write_text(ownership.MARK_TEXT)
    (tmp_path / "linked" / ownership.DIRECTORY_MARK).symlink_to(tmp_path / "marked" / ownership.DIRECTORY_MARK)
    dirs = tuple(str(tmp_path / name) for name in ("marked", "unmarked", "linked", "absent"))
    me = pwd.getpwuid(os.getuid()).pw_name  # the weights' owner: it owns every directory here
    command = uninstall.Leftovers().command(paths=dirs, directories=dirs, users=("root", "specfleet-no-such-user"),
                                            weights_dir=str(tmp_path), owner=me)
    output = subprocess.run(["bash", "-c", command], capture_output=True, text=True, check=True).stdout.splitlines()
    found = uninstall.Leftovers().process(output)
    assert found["paths"] == list(dirs[:3])
    assert found["marked"] == ([dirs[0]] if os.geteuid() == 0 else [])  # root's mark only
    assert found["accounts"]["root"] == {"uid": 0, "home": "/root", "shell": found["accounts"]["root"]["shell"],
                                         "marked": False}
    assert "specfleet-no-such-user" not in found["accounts"]
    assert sorted(found["weights"]) == sorted(dirs[:3])  # directories only, not the link inside one


def test_the_view_holds_the_hosts_service_level_which_uninstall_and_status_read():
    """uninstall.py retires the units and status reads them with the host's ServiceHost, the level that owns
    the unit prefix, keys and users; a gateway without GPUs has none."""
    worker = inventory_host("pcie-1", ["rtx_pro_6000_pcie"])
    view = status.view_of(worker, [worker])
    assert view.service == resolve_worker(worker.data, "rtx_pro_6000_pcie")[0].service
    assert status.wanted(view)[0][1] == dict(prefix="sglang", key_file="/etc/specfleet/api-key", service_user="sglang")
    gateway = inventory_host("gw", ["gateway"], **vars(host_data("gateway")))
    assert status.view_of(gateway, [gateway]).service is None


def test_a_gateway_loses_smg_and_prometheus_targets_and_has_no_weights_to_keep():
    u = planned("gw-1", ["gateway"], remove_weights=True)
    assert u.users == (("smg", "/var/lib/smg"),) and u.gateway_unit == "/etc/systemd/system/smg.service"
    assert u.weights_dir is None and not u.remove_weights
    left = {**deployed(u), "paths": [u.gateway_unit, prometheus.CONFINEMENT_FILE, prometheus.CONFIG_FILE,
                                     "/opt/specfleet"]}
    commands = uninstall.removals(u, left)
    assert commands[:2] == ["systemctl disable --now smg.service", "rm -f -- /etc/systemd/system/smg.service"]
    assert f"systemctl disable --now {prometheus.SERVICE}" in commands
    assert f"rm -f -- {prometheus.CONFINEMENT_FILE} {prometheus.CONFIG_FILE}" in commands
    assert commands[-2:] == ["userdel --remove smg 2>/dev/null || userdel smg", "rm -rf -- /opt/specfleet"]
    assert "stay" not in uninstall.summary(u, left, None)
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
    assert not uninstall.plan(view.service, None, "/srv", False).remove_weights  # kept: nothing refused


def test_a_host_with_nothing_left_answers_an_empty_leftovers():
    assert uninstall.Leftovers().process([]) == uninstall.Leftovers.default()
