"""A host of several deployments runs each as a user of its own (SERVICE_USER-NAME, in the service user's
group), a host of one as the service user: units, users, the flag check, the readiness probe, status and
uninstall. Facts in, commands out."""

import json
import shlex

import pytest
from pyinfra.facts.files import Directory
from pyinfra.facts.server import Groups, Os, Users, Which

from deployment.hosts import resolve_host
from deployment.knobs import BadHostData
from operations import status, uninstall
from operations.basics import ownership
from operations.basics.file_states import FileStates
from operations.server import api_key, readiness, sandbox, stages
from operations.server.flags import SGLangRejects
from tests.unit.fakehost import run
from tests.unit.group_data import RTX_MINORS, host_data
from tests.unit.test_gateway import inventory_host

TWO = [dict(profile="kimi_k26_dflash", gpus=[0, 1, 2, 3], tp_size=4, name="kimi"),
       dict(profile="qwen36_ddtree", gpus=[4, 5, 6, 7], name="qwen")]
KIMI, QWEN = resolve_host(host_data("rtx_pro_6000_pcie", deployments=TWO), "rtx_pro_6000_pcie")
SERVICE = KIMI.engine.service


def unit_lines(server) -> list[str]:
    unit_text, _ = sandbox.unit_files(server, "", RTX_MINORS)
    return unit_text.splitlines()


def test_two_deployments_render_units_that_run_as_users_of_their_own_each_writing_its_own_cache():
    assert (KIMI.engine.user, QWEN.engine.user) == ("sglang-kimi", "sglang-qwen")
    for d in (KIMI, QWEN):
        lines = unit_lines(d.replicas[0])
        assert f"User={d.engine.user}" in lines and f"ReadWritePaths=/home/{d.engine.user}/.cache" in lines
        assert f"Environment=TRITON_CACHE_DIR=/home/{d.engine.user}/.cache/triton" in lines
        assert not any("/home/sglang/" in line for line in lines)
        _, env = sandbox.unit_files(d.replicas[0], "", RTX_MINORS)
        assert f"\nHF_HOME=/home/{d.engine.user}/.cache/sglang-huggingface\n" in env


def test_one_deployment_runs_as_the_service_user():
    [only] = resolve_host(host_data("rtx_pro_6000_pcie"), "rtx_pro_6000_pcie")
    assert only.engine.user == "sglang" and "User=sglang" in unit_lines(only.replicas[0])
    assert stages.deployment_users((only.engine,)) == []


def test_each_deployments_user_is_created_a_system_user_in_the_service_group():
    facts = {ownership.SystemUser: None, Users: {"sglang": {}}, Groups: {"sglang"}, Os: "Linux", Which: "/usr/sbin/useradd",
             Directory: None}
    commands, _ = run(ownership.service_user, facts, user="sglang-qwen", home="/home/sglang-qwen", group="sglang")
    assert commands == ["useradd -d /home/sglang-qwen -s /usr/sbin/nologin -G sglang -r -c specfleet -M sglang-qwen",
                        "mkdir -p /home/sglang-qwen", "chown sglang-qwen:sglang-qwen /home/sglang-qwen",
                        "runuser -u sglang-qwen -- mkdir -p -m 700 /home/sglang-qwen/.cache"]
    assert [(e.user, e.home) for e in stages.deployment_users((KIMI.engine, QWEN.engine))] == [
        ("sglang-kimi", "/home/sglang-kimi"), ("sglang-qwen", "/home/sglang-qwen")]


def test_the_flag_check_runs_as_each_deployments_user():
    for d in (KIMI, QWEN):
        settings = sandbox.check_settings(d.replicas[0], RTX_MINORS)
        command = shlex.split(SGLangRejects().command(venv=d.engine.venv, args=("--model-path", d.engine.model_dir),
                                                      env=(("HF_HOME", d.engine.server_hf_home),), settings=settings))
        assert f"--property=User={d.engine.user}" in command and "--property=User=sglang" not in command


def test_the_probe_takes_a_socket_for_the_server_only_when_its_deployments_user_owns_it():
    for d in (KIMI, QWEN):
        asked = readiness._read(d)
        assert {kwargs["service_user"] for _, kwargs in asked} == {d.engine.user}
        command = readiness.ServerProbe().command(**asked[0][1])
        assert command.split(" 2>&1")[0].endswith(f" {d.engine.user}")


def test_status_reads_each_unit_over_a_socket_its_deployments_user_owns():
    host = inventory_host("pcie-1", ["rtx_pro_6000_pcie"], deployments=TWO)
    view = status.view_of(host, [host])
    [(_, kwargs)] = status.wanted(view)
    assert dict(kwargs["users"]) == {r.service_name: d.engine.user for d in (KIMI, QWEN) for r in d.replicas}
    sent = json.loads(shlex.split(status.ReplicaStates().command(**kwargs))[-1])
    assert sent["users"]["sglang@qwen-gpu4"] == "sglang-qwen" and sent["service_user"] == "sglang"


def test_uninstall_removes_both_deployments_users():
    host = inventory_host("pcie-1", ["rtx_pro_6000_pcie"], deployments=TWO)
    view = status.view_of(host, [host])
    u = uninstall.plan(view.service, view.gateway, "/srv/specfleet/models", False, view.replicas)
    assert [user for user, _ in u.users] == ["sglang", "sglang-download", "sglang-kimi", "sglang-qwen"]
    assert uninstall.asked(u)["users"] == ("sglang", "sglang-download", "sglang-kimi", "sglang-qwen")
    accounts = {user: {"uid": 990, "home": home, "shell": "/usr/sbin/nologin", "marked": True} for user, home in u.users}
    left = {**uninstall.Leftovers.default(), "accounts": accounts}
    assert uninstall.problem(u, left) is None
    removals = uninstall.removals(u, left)
    assert "userdel --remove sglang-kimi 2>/dev/null || userdel sglang-kimi" in removals
    assert "userdel --remove sglang-qwen 2>/dev/null || userdel sglang-qwen" in removals


def test_preflight_holds_each_deployments_user_to_the_account_check():
    """An existing account is taken only when it is a system user without a login shell whose home is the
    deploy's: the facts each deployment reads name its user, which preflight then checks."""
    asked = stages._read(QWEN)
    assert (ownership.SystemUser, dict(user="sglang-qwen")) in asked
    assert ownership.account_problem("sglang-qwen", "/home/sglang-qwen", dict(
        home="/home/sglang-qwen", home_exists=True, cache_owner="sglang-qwen", uid=1001, shell="/bin/bash"))


@pytest.mark.parametrize("name, user", [("Qwen", "sglang-Qwen"), ("q" * 30, "sglang-" + "q" * 30)])
def test_a_deployment_name_that_makes_no_user_name_is_refused_in_one_line_naming_the_knob(name, user):
    with pytest.raises(BadHostData) as refused:
        resolve_host(host_data("rtx_pro_6000_pcie", deployments=[TWO[0], dict(TWO[1], name=name)]),
                     "rtx_pro_6000_pcie")
    assert str(refused.value) == (
        f"deployments[{name!r}]['name']={name!r} makes the user {user!r}, not a user name ([a-z_][a-z0-9_-], at "
        "most 32): a host of several deployments runs each as SERVICE_USER-NAME: use a name of lower-case letters, "
        "digits and _ (or a shorter service_user)")


@pytest.mark.parametrize("data, refusal", [
    (dict(deployments=[{**TWO[0], "name": "download"}, TWO[1]]),
     "deployments['download']['name']='download' makes the servers' user sglang-download, the download user"),
    (dict(service_user="specfleet", deployments=[TWO[0], {**TWO[1], "name": "build"}]),
     "deployments['build']['name']='build' makes the servers' user specfleet-build, the build user"),
    (dict(gateway_user="sglang-qwen", deployments=TWO),
     "deployments['qwen']['name']='qwen' makes the servers' user sglang-qwen, the gateway's user"),
    (dict(service_user="specfleet-build"), "service_user='specfleet-build' makes the servers' user specfleet-build"),
])
def test_no_deployment_runs_as_the_download_build_or_gateway_user(data, refusal):
    with pytest.raises(BadHostData) as refused:
        resolve_host(host_data("rtx_pro_6000_pcie", **data), "rtx_pro_6000_pcie")
    assert str(refused.value).startswith(refusal) and "\n" not in str(refused.value)


def test_each_deployment_has_a_worker_admin_key_its_users_group_alone_reads_and_its_units_launcher_is_given():
    """On a host of several deployments, the key to one's admin routes is no other's to read: a file of its
    own, root's, 0640, group its own user's (which useradd makes with it); a host of one keeps the host's."""
    assert (KIMI.engine.admin_key_file, QWEN.engine.admin_key_file) == (
        "/etc/specfleet/admin-api-key-kimi", "/etc/specfleet/admin-api-key-qwen")
    for d in (KIMI, QWEN):
        [command] = run(api_key.admin_key, {FileStates: {d.engine.admin_key_file: None}}, engine=d.engine)[0]
        assert command.endswith(f"secret /etc/specfleet admin-api-key-{d.name} 640 {d.engine.user}")
        _, env = sandbox.unit_files(d.replicas[0], "", RTX_MINORS)
        assert f"\nSPECFLEET_ADMIN_API_KEY_FILE={d.engine.admin_key_file}\n" in env
        assert (FileStates, dict(paths=(d.engine.admin_key_file,))) in stages._read(d)
    [only] = resolve_host(host_data("rtx_pro_6000_pcie"), "rtx_pro_6000_pcie")
    assert only.engine.admin_key_file == "/etc/specfleet/admin-api-key"
    [command] = run(api_key.admin_key, {FileStates: {only.engine.admin_key_file: None}}, engine=only.engine)[0]
    assert command.endswith("secret /etc/specfleet admin-api-key 640 sglang")
