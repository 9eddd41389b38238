"""operations.server.unit.configure and operations.basics.ownership: facts in, commands out (pyinfra's systemd.service
and files.directory run for real on the same facts)."""

import re
from dataclasses import replace
from pathlib import Path

import pytest

from pyinfra.api.operation import OperationMeta
from pyinfra.facts.files import Directory
from pyinfra.context import ctx_host
from pyinfra.facts.systemd import SystemdEnabled, SystemdStatus

from deployment.hosts import resolve, resolve_host
from deployment.knobs import BadHostData
from operations.basics import ownership
from operations.basics.file_states import FileStates
from operations.basics.units import ServiceState, any_change
from operations.python.virtualenvs import VenvRequirement, fingerprint
from operations.server import sandbox, unit
from operations.server.flags import SGLangRejects

from tests.unit.fakehost import FakeHost, failure, ran, run
from operations.gpu.facts import NvidiaDriver
from tests.unit.group_data import RTX_MINORS, captured_driver, host_data

D = resolve(host_data("rtx_pro_6000_pcie"), "rtx_pro_6000_pcie").replicas[0]
SERVICE = D.engine.service  # what every server of the host shares
INPUTS = "sglang=3f2a target=ab12"
UNIT, ENV = unit.unit_files(D, INPUTS, RTX_MINORS)
ROOT_DIRECTORIES = (SERVICE.install_dir, f"{SERVICE.install_dir}/bin", SERVICE.config_dir)


def configure(facts: dict, restart_when=()) -> tuple[list, list[str]]:
    """The unit's operation on a host answering `facts`, with this run's restart decision."""
    return run(unit.configure, facts, server=D, restart=unit.Restart(D, INPUTS, list(restart_when)))


def current(unit=UNIT, env=ENV, active="active", enabled="enabled") -> dict:
    from operations.basics.file_states import sha1_of
    return {ServiceState: dict(unit_sha1=sha1_of(unit.encode()), env_sha1=sha1_of(env.encode()),
                                       active=active, enabled=enabled),
            SystemdStatus: {f"{NAME}.service": active == "active"},
            SystemdEnabled: {f"{NAME}.service": enabled == "enabled"},
            VenvRequirement: {"version": "0.5.23", "fingerprint": fingerprint(D.engine.sglang_requirement, SERVICE.pip_index_url)},
            NvidiaDriver: captured_driver()}


NAME = "sglang@kimi_k26_dflash-gpu0-7"  # Kimi K2.6 on this class: one replica over all eight cards


def test_unchanged_and_running_is_a_noop():
    assert D.service_name == NAME and D.unit_file == f"/etc/systemd/system/{NAME}.service"
    commands, noops = configure(current())
    assert commands == [] and noops == [f"{NAME} is running its current unit ({INPUTS})"]


def test_a_changed_api_key_alone_restarts_through_systemd_service():
    commands, _ = configure(current(), restart_when=[ran(changed=True)])
    assert commands == [f"systemctl restart {NAME}.service"]


def test_a_stopped_disabled_service_is_started_and_enabled():
    commands, _ = configure(current(active="inactive", enabled="disabled"))
    assert commands == [f"systemctl start {NAME}.service", f"systemctl enable {NAME}.service"]


def test_rejected_flags_fail_before_anything_is_written():
    facts = {**current(unit="an older unit"), SGLangRejects: "--attention-backend: invalid choice: 'flashmla_v9'"}
    [problem] = failure(configure(facts)[0])
    assert "rejects the rendered flags (--attention-backend: invalid choice" in problem
    assert problem.endswith(f"{NAME} was left as it was")


def test_each_replica_renders_its_own_gpus_and_port_and_restarts_alone():
    replicas = resolve_host(host_data("rtx_pro_6000_pcie", profile="qwen36_ddtree"), "rtx_pro_6000_pcie")[0].replicas
    rendered = [unit.unit_files(r, INPUTS, RTX_MINORS) for r in replicas]
    assert [r.service_name for r in replicas] == [f"sglang@qwen36_ddtree-gpu{i}" for i in range(8)]
    for i, (unit_text, env_text) in enumerate(rendered):
        assert f"\nCUDA_VISIBLE_DEVICES={i}\n" in env_text and "\nCUDA_DEVICE_ORDER=PCI_BUS_ID\n" in env_text
        assert f" --port {30000 + i} " in unit_text and " --tp-size 1 " in unit_text
        assert f"EnvironmentFile=/etc/specfleet/sglang@qwen36_ddtree-gpu{i}.env\n" in unit_text
    # Replica 3's files changed, the others' did not: only replica 3 restarts.
    built = {"version": "0.5.23", "fingerprint": fingerprint(replicas[3].engine.sglang_requirement, replicas[3].engine.service.pip_index_url)}
    state = {ServiceState: dict(unit_sha1="an older unit", env_sha1="an older env", active="active", enabled="enabled"),
             SGLangRejects: None, VenvRequirement: built, NvidiaDriver: captured_driver()}
    with ctx_host.use(FakeHost(state)):
        assert unit.Restart(replicas[3], INPUTS, []).decision().restarts
    same = {ServiceState: current(*rendered[4])[ServiceState], VenvRequirement: built, NvidiaDriver: captured_driver()}
    with ctx_host.use(FakeHost(same)):
        assert not unit.Restart(replicas[4], INPUTS, []).decision().restarts


def replacing(*restarts: unit.Restart) -> unit.Replacement:
    return unit.Replacement(SERVICE, list(restarts))


def test_units_no_deployment_wants_stop_first_and_their_files_go_once_the_new_ones_generate():
    units = {"sglang": {"port": 30000, "model": "kimi-k2.6", "user": "sglang", "loads": []},
             NAME: {"port": 30000, "model": "kimi-k2.6", "user": "sglang", "loads": []}}
    facts = {**current(unit="the new unit is not written yet"), SGLangRejects: None, unit.ServerUnits: units,
             SystemdStatus: {"sglang.service": True}, SystemdEnabled: {"sglang.service": True}}
    commands, _ = run(unit.retired, facts, replacement=replacing(unit.Restart(D, INPUTS, [])))
    assert commands == ["systemctl stop sglang.service", "systemctl disable sglang.service"]
    commands, _ = run(unit.removed, facts, replacement=replacing(unit.Restart(D, INPUTS, [])))
    assert commands == ["rm -f -- /etc/systemd/system/sglang.service /etc/specfleet/sglang.env "
                        "/etc/systemd/system/sglang.service.specfleet-previous /etc/specfleet/sglang.env.specfleet-previous "
                        "/etc/specfleet/sglang.kv-plan.json",
                        "systemctl daemon-reload", "systemctl reset-failed sglang.service 2>/dev/null || true"]
    for operation in (unit.retired, unit.removed):
        commands, noops = run(operation, {**current(), unit.ServerUnits: {NAME: units[NAME]}},
                              replacement=replacing(unit.Restart(D, INPUTS, [])))
        assert commands == [] and len(noops) == 1


def test_a_failed_switch_stops_the_new_units_and_starts_the_replaced_ones():
    """The replaced unit's files stay until the end of the run: the one command removes the new replica's and
    starts it again."""
    units = {"sglang@qwen36_ddtree-gpu0": {"port": 30000, "model": "qwen3.6-27b", "user": "sglang", "loads": []}}
    facts = {**current(unit="the new unit is not written yet"), unit.ServerUnits: units, SGLangRejects: None}
    facts[ServiceState] = {**facts[ServiceState], "unit_sha1": None, "env_sha1": None}  # no unit of D's name before
    with ctx_host.use(FakeHost(facts)):
        replacement = replacing(unit.Restart(D, INPUTS, []))
        assert [s.service_name for s in replacement.new()] == [NAME]
        command = replacement.restore_command()
    assert command == " && ".join([
        f"{{ systemctl disable --now {NAME} 2>/dev/null || true; }}",
        f"rm -f -- /etc/systemd/system/{NAME}.service /etc/specfleet/{NAME}.env "
        f"/etc/systemd/system/{NAME}.service.specfleet-previous /etc/specfleet/{NAME}.env.specfleet-previous "
        f"/etc/specfleet/{NAME}.kv-plan.json",
        "systemctl daemon-reload", f"{{ systemctl reset-failed {NAME}.service 2>/dev/null || true; }}",
        "systemctl enable --now sglang@qwen36_ddtree-gpu0.service"])


def test_nothing_is_retired_while_the_hosts_sglang_refuses_a_new_unit():
    units = {"sglang": {"port": 30000, "model": "kimi-k2.6", "user": "sglang", "loads": []}}
    facts = {**current(unit="an older unit"), SGLangRejects: "--attention-backend: invalid choice: 'x'",
             unit.ServerUnits: units}
    commands, _ = run(unit.retired, facts, replacement=replacing(unit.Restart(D, INPUTS, [])))
    [problem] = failure(commands)
    assert "rejects the rendered flags" in problem and problem.endswith(f"{NAME} was left as it was")
    # Replicas refused alike (they differ in GPUs and port alone): one line naming each.
    other = replace(D, service_name=f"{NAME}-2", port=D.port + 1)
    commands, _ = run(unit.retired, facts, replacement=replacing(unit.Restart(D, INPUTS, []),
                                                                 unit.Restart(other, INPUTS, [])))
    [problem] = failure(commands)
    assert problem.endswith(f"{NAME}, {NAME}-2 were left as they were"), problem


def test_before_the_wanted_sglang_is_installed_nothing_asks_it_about_the_flags():
    # --dry on a fresh host: the run installs SGLang before the unit, so no refusal can be known yet.
    facts = {**current(unit="an older unit"), VenvRequirement: None, SGLangRejects: "would be asked: exit=1"}
    with ctx_host.use(FakeHost(facts)):
        decision = unit.Restart(D, INPUTS, []).decision()
    assert decision.refused is None and decision.reason == unit.FILES_CHANGED and decision.restarts
    with ctx_host.use(FakeHost({**facts, VenvRequirement: current()[VenvRequirement]})):  # installed: it is asked
        assert unit.Restart(D, INPUTS, []).decision().refused == "would be asked: exit=1"


def test_the_units_are_confined_and_the_server_may_reach_the_gpus():
    for line in ("NoNewPrivileges=yes", "ProtectSystem=strict", "ProtectHome=read-only", "PrivateTmp=yes",
                 "UMask=0077", "CapabilityBoundingSet=", "DevicePolicy=closed", "DeviceAllow=char-nvidia-uvm rw",
                 "ReadWritePaths=/home/sglang/.cache", "ProtectKernelTunables=yes", "ProtectProc=invisible",
                 "ProtectControlGroups=yes"):
        assert f"\n{line}\n" in UNIT, line
    # What a real GPU host needs off (PrivateDevices hides /dev/nvidia*; ProcSubset=pid hides
    # /proc/meminfo from SGLang's psutil): neither is set at all.
    assert "\nPrivateDevices=" not in UNIT and "\nProcSubset=" not in UNIT


def device_rules(unit_text: str) -> list[str]:
    return [line.removeprefix("DeviceAllow=") for line in unit_text.splitlines() if line.startswith("DeviceAllow=")]


# /dev/nvidiactl by its number, and nvidia-uvm's two nodes by their class (the kernel picks their major).
CONTROL = ["/dev/char/195:255 rw", "char-nvidia-uvm rw"]


def test_each_replica_may_open_its_own_gpus_nodes_by_minor_number_and_no_other_gpus():
    """The 8x RTX PRO 6000 capture: the GPU first in PCI order (index 0, CUDA_VISIBLE_DEVICES=0) is /dev/nvidia2,
    named by its number (195:2), which systemd takes without the node: a unit started before the driver made
    its nodes (right after a boot) still gets its rule, where a missing /dev/nvidia2 would be skipped."""
    assert RTX_MINORS == (2, 3, 0, 1, 6, 7, 4, 5)
    replicas = resolve_host(host_data("rtx_pro_6000_pcie", profile="qwen36_ddtree"), "rtx_pro_6000_pcie")[0].replicas
    rules = [device_rules(unit.unit_files(r, INPUTS, RTX_MINORS)[0]) for r in replicas]
    assert rules[0] == ["/dev/char/195:2 rw", *CONTROL] and rules[2] == ["/dev/char/195:0 rw", *CONTROL]
    assert [rule[0] for rule in rules] == [f"/dev/char/195:{m} rw" for m in RTX_MINORS]
    # One replica over the eight: every GPU's node, in its CUDA_VISIBLE_DEVICES order; no major-wide rule.
    assert device_rules(UNIT) == [*(f"/dev/char/195:{m} rw" for m in RTX_MINORS), *CONTROL]
    assert "char-nvidia " not in UNIT
    # The H200 capture's minors (<minor_number> in -q -x, Minor Number in -q): 0 and 1.
    assert captured_driver("h200-x2-nvlink/q.txt")["gpu_minor_numbers"] == [0, 1]
    # No driver loaded (nvidia-smi gave no minor number, which preflight refuses): no GPU's node, the control nodes alone.
    assert device_rules(unit.unit_files(replicas[0], INPUTS, ())[0]) == CONTROL


def test_the_unit_reads_the_minor_numbers_from_the_hosts_driver_fact():
    replica = resolve_host(host_data("rtx_pro_6000_pcie", profile="qwen36_ddtree"), "rtx_pro_6000_pcie")[0].replicas[0]
    facts = {ServiceState: dict(unit_sha1="an older unit", env_sha1="an older env", active="active", enabled="enabled"),
             SGLangRejects: None, VenvRequirement: None, NvidiaDriver: captured_driver()}
    with ctx_host.use(FakeHost(facts)):
        decision = unit.Restart(replica, INPUTS, []).decision()
    assert device_rules(decision.unit_text)[0] == "/dev/char/195:2 rw"


def test_the_hf_token_is_out_of_the_servers_reach():
    """The download user's home, the token's, is inaccessible to the unit; the server's own HF_HOME lies in
    the service user's cache."""
    assert f"\nInaccessiblePaths=-{SERVICE.download_home}\n" in UNIT and SERVICE.hf_home.startswith(SERVICE.download_home + "/")
    assert f"\nHF_HOME={D.engine.server_hf_home}\n" in ENV and SERVICE.hf_home not in ENV
    assert D.engine.server_hf_home.startswith("/home/sglang/.cache/") and not D.engine.server_hf_home.startswith(SERVICE.hf_home)


def test_a_stop_signals_the_main_process_alone_and_waits_for_the_longest_generation():
    """KillMode=mixed: SGLang's schedulers have no SIGTERM handler, its main process drains them."""
    assert "\nKillMode=mixed\n" in UNIT
    assert f"\nTimeoutStopSec={SERVICE.longest_generation_s + 30}\n" in UNIT and SERVICE.longest_generation_s == 900


def test_a_node_groups_rank_1_stops_every_process_at_once():
    """A rank >= 1 holds no request of its own (rank 0 serves HTTP); its main process waits on its schedulers,
    so SIGTERM to it alone would leave the stop waiting for its whole timeout."""
    rank = {n: unit.unit_files(replace(D, engine=replace(D.engine, node_args=("--nnodes", "2", "--node-rank", str(n)),
                                                         drains_on_stop=n == 0)), INPUTS, RTX_MINORS)[0] for n in (0, 1)}
    assert "\nKillMode=mixed\n" in rank[0] and "\nKillMode=control-group\n" in rank[1]


def directory(user="root", mode="755"):
    return dict(kind="directory", mode=mode, user=user, group=user, digest=None)


def test_root_directories_in_place_are_a_noop_and_the_service_users_config_dir_is_taken_back():
    ok = {p: directory() for p in (SERVICE.install_dir, f"{SERVICE.install_dir}/bin", SERVICE.config_dir)}
    commands, noops = run(ownership.root_directories, {FileStates: ok}, paths=ROOT_DIRECTORIES)
    assert commands == [] and noops == ["/opt/specfleet, /opt/specfleet/bin, /etc/specfleet are root's (0755)"]
    # An earlier deploy's API key upload made /etc/specfleet the service user's.
    facts = {FileStates: {**ok, SERVICE.config_dir: directory("sglang")},
             Directory: dict(mode=755, user="sglang", group="sglang")}
    commands, _ = run(ownership.root_directories, facts, paths=ROOT_DIRECTORIES)
    assert commands == ["chown root:root /etc/specfleet"]


def test_a_cache_root_created_is_handed_to_the_service_user_not_following_links():
    user = {"home": "/home/sglang", "home_exists": True, "cache_owner": "root", "uid": 998,
            "shell": "/usr/sbin/nologin", "marked": True}
    commands, _ = run(ownership.service_user, {ownership.SystemUser: user}, user="sglang", home="/home/sglang")
    assert commands == ["chown --no-dereference sglang:sglang /home/sglang/.cache"]
    commands, noops = run(ownership.service_user, {ownership.SystemUser: dict(user, cache_owner="sglang")},
                          user="sglang", home="/home/sglang")
    assert commands == [] and noops == ["user sglang exists with home /home/sglang"]
    # None made: on a fresh host, where the token is the download user's, nothing else makes it, and every
    # confined unit names it writable (systemd fails a missing one: 226/NAMESPACE). The user makes it.
    commands, _ = run(ownership.service_user, {ownership.SystemUser: dict(user, cache_owner=None)},
                      user="sglang", home="/home/sglang")
    assert commands == ["runuser -u sglang -- mkdir -p -m 700 /home/sglang/.cache"]


def test_system_user_reads_home_cache_owner_uid_shell_and_the_deploys_mark():
    assert ownership.SystemUser().process(["/home/sglang yes sglang 998 /usr/sbin/nologin marked"]) == \
        {"home": "/home/sglang", "home_exists": True, "cache_owner": "sglang", "uid": 998, "shell": "/usr/sbin/nologin",
         "marked": True}
    assert ownership.SystemUser().process(["/home/my user no - 1000 - -"]) == \
        {"home": "/home/my user", "home_exists": False, "cache_owner": None, "uid": 1000, "shell": None,
         "marked": False}


OWN = {"home": "/home/sglang", "home_exists": True, "cache_owner": "sglang", "uid": 998, "shell": "/usr/sbin/nologin",
       "marked": True}


@pytest.mark.parametrize("account, why", [
    (dict(OWN, uid=0), "has uid 0 (root's privileges)"),
    (dict(OWN, uid=1000, shell="/bin/bash"), "is a login account (uid 1000, not a system user's below 1000)"),
    (dict(OWN, shell="/bin/bash"), "has the login shell /bin/bash"),
    (dict(OWN, shell=None), "has the login shell /bin/sh"),
    (dict(OWN, home="/var/www", uid=33), "has the home /var/www, not /home/sglang: it belongs to something else"),
])
def test_an_existing_account_that_is_not_the_deploys_own_system_user_is_refused_unchanged(account, why):
    commands, _ = run(ownership.service_user, {ownership.SystemUser: account}, user="sglang", home="/home/sglang")
    [problem] = failure(commands)  # one refusal, no usermod, no chown
    assert problem == (f"host-1: the account sglang {why}; the deploy would take it over (no login shell, a service "
                       "running as it): name a user of the service's own, which the deploy creates")


def test_the_deploys_own_user_is_kept():
    commands, noops = run(ownership.service_user, {ownership.SystemUser: OWN}, user="sglang", home="/home/sglang")
    assert commands == [] and noops == ["user sglang exists with home /home/sglang"]
    # One without the deploy's mark (taken over, or made before the mark) gets it, once: uninstall.py
    # removes only marked accounts.
    commands, _ = run(ownership.service_user, {ownership.SystemUser: dict(OWN, marked=False)}, user="sglang",
                      home="/home/sglang")
    assert commands == ["usermod --comment specfleet sglang"]
    assert ownership.account_problem("sglang", "/home/sglang", None) is None  # absent: the deploy creates it


def test_the_smoke_tests_p2p_decision_is_in_the_unit_and_a_restart_input():
    """The decision reaches the unit only through smoke.decided_env, read from the host's smoke record:
    P2P turned off on this host changes the environment file, so the unit restarts; a record that keeps
    P2P leaves the current unit as it is."""
    from deployment.hosts import resolve as resolve_deployment
    from operations.gpu import smoke
    from operations.gpu.smoke import GpuSmokeRecord

    test = resolve_deployment(host_data("rtx_pro_6000_pcie"), "rtx_pro_6000_pcie").host.smoke
    hung = dict(verdict="passed", p2p=dict(enabled=False, decided_by="measurement", reason="hung"))
    kept = dict(verdict="passed", p2p=dict(enabled=True, decided_by="measurement"))

    def restart_after_smoke(record):
        with ctx_host.use(FakeHost({**current(), GpuSmokeRecord: dict(boot_id="b", record=record),
                                    SGLangRejects: None})):
            decided = unit.Restart(D, INPUTS, [], decided_env=lambda: smoke.decided_env(test))
            decided.decision()
        return decided

    assert restart_after_smoke(kept).decision().restarts is False
    commands, noops = run(unit.configure, {**current(), GpuSmokeRecord: dict(boot_id="b", record=kept)}, server=D,
                          restart=unit.Restart(D, INPUTS, [], decided_env=lambda: smoke.decided_env(test)))
    assert commands == [] and noops == [f"{NAME} is running its current unit ({INPUTS})"]
    decided = restart_after_smoke(hung)
    assert "NCCL_P2P_DISABLE=1\n" in decided.decision().env_text and "NCCL_P2P_DISABLE" not in ENV
    assert decided.decision().reason == unit.FILES_CHANGED and decided.decision().restarts


def test_a_change_is_what_an_operation_did_once_it_ran_and_what_it_will_do_before():
    """`any_change` asks pyinfra 3's did_change/will_change; OperationMeta.changed is deprecated (gone in 4)."""
    assert any_change([OperationMeta("pending", is_change=True)]) and any_change([ran(changed=True)])
    assert not any_change([OperationMeta("pending", is_change=False), ran(changed=False)])
    repo = Path(__file__).resolve().parents[2]
    product = [*(repo / "operations").rglob("*.py"), *repo.glob("*.py")]
    assert [str(p.relative_to(repo)) for p in product if re.search(r"\.changed\b", p.read_text())] == []


def ip_lists(unit_text: str) -> list[str]:
    return [line for line in unit_text.splitlines() if line.startswith(("IPAddress", "SocketBind"))]


def test_a_loopback_replica_admits_packets_from_loopback_alone_and_cannot_take_the_fan_outs_port():
    """torch's TCPStore on --nccl-port listens on every address whatever --host says: the unit's IP access list
    confines it (and every other socket of the unit) to loopback; the weights fan-out's port is no server's to bind."""
    assert sandbox.reached_from(D, (), None) == ()
    assert ip_lists(UNIT) == ["IPAddressDeny=any", "IPAddressAllow=127.0.0.0/8 ::1/128", "SocketBindDeny=tcp:30900"]
    # The flag check's, the bench's servers' and client's transient units take the unit's settings (systemd-run
    # takes no `localhost` in IPAddressAllow=, hence the prefixes).
    assert [s for s in sandbox.check_settings(D, RTX_MINORS) if s.startswith(("IPAddress", "SocketBind"))] == ip_lists(UNIT)


def test_an_exposed_replica_admits_the_gateways_that_route_it_and_its_node_group_and_without_a_gateway_no_list():
    from deployment.gateway import membership
    from tests.unit.test_gateway import inventory_host
    from tests.unit.test_nodes import resolved, two_nodes
    gateway = inventory_host("gw", ["gateway"], ssh_hostname="10.0.0.2", gateway_bind_address="10.1.0.2")
    worker = inventory_host("w", ["rtx_pro_6000_pcie"], ssh_hostname="10.0.0.5", bind_address="0.0.0.0")
    replica = resolve(worker.data, "rtx_pro_6000_pcie").replicas[0]
    routes = membership.routes(membership.resolve([gateway, worker]), worker, replica)
    # From its host's address it connects to the replica; at its API's the bench's client reaches it.
    allowed = sandbox.reached_from(replica, membership.addresses(routes), None)
    assert allowed == ("10.0.0.2", "10.1.0.2")
    assert "IPAddressAllow=127.0.0.0/8 ::1/128 10.0.0.2 10.1.0.2" in ip_lists(unit.unit_files(replica, INPUTS, RTX_MINORS,
                                                                                                allowed)[0])
    # Exposed with no gateway of the run: its clients are the site's, so no list (the fan-out's port stays closed).
    assert sandbox.reached_from(replica, (), None) is None
    assert ip_lists(unit.unit_files(replica, INPUTS, RTX_MINORS, None)[0]) == ["SocketBindDeny=tcp:30900"]
    # A node group's members reach each other (dist-init, NCCL), each admitting the others.
    inventory = two_nodes()
    rank0, rank1 = (resolved(inventory, h) for h in inventory)
    assert sandbox.reached_from(rank0.replicas[0], (), rank0.node_group) == ("10.0.0.2",)
    assert sandbox.reached_from(rank1.replicas[0], (), rank1.node_group) == ("10.0.0.1",)


def test_a_gateway_known_by_a_name_is_refused_before_any_unit_admits_it():
    """An allow list takes addresses: a gateway's name resolved on the controller would let a spoofed answer in."""
    from deployment.gateway import membership
    from tests.unit.test_gateway import inventory_host
    gateway = inventory_host("gw", ["gateway"], ssh_hostname="gw.example", gateway_bind_address="0.0.0.0")
    worker = inventory_host("w", ["rtx_pro_6000_pcie"], ssh_hostname="10.0.0.5", bind_address="0.0.0.0")
    replica = resolve(worker.data, "rtx_pro_6000_pcie").replicas[0]
    [route] = membership.routes(membership.resolve([gateway, worker]), worker, replica)
    assert route.problem == ("gw: its address 'gw.example' is not an IP address, and w's servers admit their "
                             "gateways by address (IPAddressAllow=): give gw its IP address (gateway_worker_address)")
    assert membership.addresses([route]) == ()


def test_server_ip_allow_adds_networks_to_every_unit_of_the_models_code_and_any_lifts_the_list():
    """FlashInfer's first-use kernel downloads, or clients of an exposed server that no gateway of the run routes:
    the site names their networks; its values are IP networks, nothing else reaches the unit file."""
    allow = resolve(host_data("rtx_pro_6000_pcie", server_ip_allow=["10.0.5.7/24", "10.9.0.1"]),
                    "rtx_pro_6000_pcie").replicas[0]
    assert "IPAddressAllow=127.0.0.0/8 ::1/128 10.0.5.0/24 10.9.0.1/32" in ip_lists(unit.unit_files(allow, INPUTS,
                                                                                                      RTX_MINORS)[0])
    assert "IPAddressAllow=127.0.0.0/8 ::1/128 10.0.5.0/24 10.9.0.1/32" in sandbox.check_settings(allow, RTX_MINORS)
    exposed = resolve(host_data("rtx_pro_6000_pcie", bind_address="0.0.0.0", server_ip_allow=["any"]),
                      "rtx_pro_6000_pcie").replicas[0]
    assert sandbox.reached_from(exposed, (), None) == ()  # the site named its clients: the list stays
    assert "IPAddressAllow=127.0.0.0/8 ::1/128 0.0.0.0/0 ::/0" in ip_lists(unit.unit_files(exposed, INPUTS, RTX_MINORS)[0])
    for wrong in (["10.0.0.1; IPAddressAllow=any"], "10.0.0.0/8", ["gw.example"]):
        with pytest.raises(BadHostData, match="server_ip_allow"):
            resolve(host_data("rtx_pro_6000_pcie", server_ip_allow=wrong), "rtx_pro_6000_pcie")
