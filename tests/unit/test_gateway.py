"""The gateway's data, arguments and worker list, facts in and values out (no hosts)."""

import dataclasses
import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from pyinfra.facts.systemd import SystemdEnabled, SystemdStatus

from deployment.gateway.config import resolve as resolve_gateway
from deployment.gateway.membership import Route, resolve as fleet, routes, workers
from deployment.hosts import resolve, resolve_host
from deployment.knobs import BadHostData
from operations.basics.file_states import FileStates, digest_of, sha1_of
from operations.basics.units import ServiceState
from operations.gateway import service
from operations.gateway.drain import LEGACY_ADMIN_KEY, drain, drain_retired, joins, no_admin_key, rejoin
from operations.gateway.registry import GatewayWorkers
from operations.gpu.facts import NvidiaDriver
from operations.python.virtualenvs import VenvRequirement, fingerprint
from operations.server import unit
from operations.server.flags import SGLangRejects
from tests.unit.fakehost import failure, ran, run, run_host
from tests.unit.group_data import host_data


class InventoryHost(SimpleNamespace):
    """What the fleet reads of a pyinfra host: name, groups, data (attributes and .get)."""


class Data(SimpleNamespace):
    def get(self, key, default=None):
        return getattr(self, key, default)


def inventory_host(name: str, groups: list[str], **data) -> InventoryHost:
    values = {}
    for group in groups:  # all.py, then each group's file, then the host's own data
        values.update(vars(host_data(group)))
    return InventoryHost(name=name, groups=groups, data=Data(**{**values, **data}))


def test_gateway_arguments_come_from_group_data_and_never_hold_the_key():
    g = resolve_gateway(host_data("gateway"))
    args = g.args()
    assert args[args.index("--policy") + 1] == "cache_aware"
    assert args[args.index("--port") + 1] == "30080" and args[args.index("--prometheus-port") + 1] == "29000"
    assert args[args.index("--host") + 1] == "127.0.0.1"  # loopback unless asked, with a key
    assert "--api-key" not in args


@pytest.mark.parametrize("key, value", [("gateway_policy", "round_robin; rm -rf /"),
                                        ("gateway_bind_address", "0.0.0.0 --api-key x"),
                                        ("gateway_requirement", "smg==1.13.0 | sh"),
                                        ("gateway_port", "30080a"),
                                        ("gateway_user", "smg; id"),
                                        ("install_dir", "opt/specfleet"),
                                        ("gateway_health", {"endpoint": "/health"})])
def test_a_value_that_would_reach_the_unit_file_unchecked_is_one_line_naming_the_knob(key, value):
    """BadHostData: deploy.py refuses the host with this line; the other hosts go on."""
    with pytest.raises(BadHostData, match=key) as refused:
        resolve_gateway(host_data("gateway", **{key: value}))
    assert "\n" not in str(refused.value) and repr(value) in str(refused.value)


@pytest.mark.parametrize("profile, fix", [
    ("qwen36_ddtre", "did you mean 'qwen36_ddtree'?"), ("nosuch", "use one of kimi_k26_ddtree, kimi_k26_dflash")])
def test_a_gateway_of_an_unknown_profile_is_refused_in_one_line_with_the_nearest_profile(profile, fix):
    """The gateway reads its model from the host's profile: an unknown one is BadHostData (deploy.py, status.py
    and the fleet's membership refuse the host in its line), not a KeyError out of the run."""
    with pytest.raises(BadHostData) as refused:
        resolve_gateway(host_data("gateway", profile=profile))
    assert str(refused.value).startswith(f"profile={profile!r} is no profile: {fix}"), str(refused.value)
    gateway = inventory_host("gw", ["gateway"], profile=profile)
    assert fleet([gateway]).gateways[0].problem == f"gw: {refused.value}"


def test_workers_are_the_inventory_hosts_serving_the_gateways_model_at_their_network_address():
    gateway = inventory_host("gw", ["gateway"])
    inventory = [
        gateway,
        inventory_host("a", ["rtx_pro_6000_pcie"], ssh_hostname="10.0.0.5", bind_address="0.0.0.0"),
        inventory_host("b", ["b200_nvlink"], gateway_worker_address="b.internal", ssh_hostname="10.0.0.6",
                       bind_address="0.0.0.0"),
        inventory_host("other-model", ["rtx_pro_6000_pcie"], profile="qwen36_ddtree", bind_address="0.0.0.0"),
    ]
    found = workers(fleet(inventory), gateway, resolve_gateway(gateway.data).model)
    assert [(w.name, w.url, w.problem, w.replica) for w in found] == [
        ("a", "http://10.0.0.5:30000", None, "sglang@kimi_k26_dflash-gpu0-7"),
        ("b", "http://b.internal:30000", None, "sglang@kimi_k26_dflash-gpu0-7")]


def test_each_replica_is_a_worker_at_its_own_port_and_a_host_serves_two_models_to_two_gateways():
    kimi = inventory_host("gw", ["gateway"])
    qwen = inventory_host("gw2", ["gateway"], profile="qwen36_ddtree")
    replicas = inventory_host("a", ["rtx_pro_6000_pcie"], ssh_hostname="10.0.0.5", bind_address="0.0.0.0",
                              profile="qwen36_ddtree")
    both = inventory_host("b", ["rtx_pro_6000_pcie"], ssh_hostname="10.0.0.6", bind_address="0.0.0.0",
                          deployments=[dict(profile="kimi_k26_dflash", gpus=[0, 1, 2, 3], tp_size=4),
                                       dict(profile="qwen36_ddtree", gpus=[6, 7])])
    inventory = [kimi, qwen, replicas, both]
    assert [(w.name, w.url, w.replica) for w in workers(fleet(inventory), qwen, "qwen3.6-27b")] == [
        *(("a", f"http://10.0.0.5:{30000 + i}", f"sglang@qwen36_ddtree-gpu{i}") for i in range(8)),
        ("b", "http://10.0.0.6:30006", "sglang@qwen36_ddtree-gpu6"), ("b", "http://10.0.0.6:30007", "sglang@qwen36_ddtree-gpu7")]
    assert [(w.name, w.url, w.replica) for w in workers(fleet(inventory), kimi, "kimi-k2.6")] == [
        ("b", "http://10.0.0.6:30000", "sglang@kimi_k26_dflash-gpu0-3")]
    kimi_replica, qwen_replica = (d.replicas[-1] for d in resolve_host(both.data, "rtx_pro_6000_pcie"))
    assert [(r.gateway, r.worker_url(kimi_replica.port)) for r in routes(fleet(inventory), both, kimi_replica)] == [
        ("gw", "http://10.0.0.6:30000")]
    assert [(r.gateway, r.worker_url(qwen_replica.port)) for r in routes(fleet(inventory), both, qwen_replica)] == [
        ("gw2", "http://10.0.0.6:30007")]


class Run:
    """A pyinfra run as the fleet's cache keys it (weakly, as pyinfra's State)."""


class Inventory(list):
    """pyinfra's inventory as the deploy iterates it, with its run's state."""

    state = Run()


def test_the_inventory_is_resolved_once_per_run_whatever_each_host_asks_of_its_gateways(monkeypatch):
    """Every host's deploy file asks the gateways of each of its replicas (drain, rejoin), of its retired units,
    and a gateway its workers: one resolution per worker host in the run, not one per question."""
    from deployment import hosts
    from deployment.gateway import membership
    workers = 4
    inventory = Inventory([inventory_host("gw", ["gateway"], profile="qwen36_ddtree"), *(
        inventory_host(f"w{i}", ["rtx_pro_6000_pcie"], ssh_hostname=f"10.0.0.{i + 1}", bind_address="0.0.0.0",
                       profile="qwen36_ddtree") for i in range(workers))])
    resolved = []
    resolve_host = hosts.resolve_host
    monkeypatch.setattr(hosts, "resolve_host", lambda *args: resolved.append(args) or resolve_host(*args))
    answers = []
    for host in inventory:  # deploy.py, as pyinfra runs it for each host
        fleet = membership.of(inventory)
        if host.name == "gw":
            answers.append(len(membership.workers(fleet, host, "qwen3.6-27b")))
            continue
        for replica in resolve_host(host.data, "rtx_pro_6000_pcie")[0].replicas:
            answers.append(len(membership.routes(fleet, host, replica)))
        answers.append(len(membership.gateways(fleet, host)))
    assert answers == [workers * 8, *([1] * (8 + 1)) * workers]  # its workers; a route per replica, a gateway per host
    # A resolution of the inventory per question would make 8·N² + N of them, 132 here.
    assert len(resolved) == workers
    assert membership.of(Inventory(inventory)) is fleet  # one run, one fleet
    assert membership.of(type("Later", (Inventory,), {"state": Run()})(inventory)) is not fleet


def test_a_loopback_worker_on_another_host_is_a_problem_and_on_the_gateways_own_host_is_not():
    both = inventory_host("both", ["rtx_pro_6000_pcie", "gateway"], bind_address="127.0.0.1")
    apart = inventory_host("apart", ["rtx_pro_6000_pcie"], ssh_hostname="10.0.0.7", bind_address="127.0.0.1")
    found = {w.name: w for w in workers(fleet([both, apart]), both, resolve_gateway(both.data).model)}
    assert found["both"].url == "http://127.0.0.1:30000" and found["both"].problem is None
    assert "serves on 127.0.0.1 only" in found["apart"].problem


def test_a_workers_gateways_are_driven_on_their_own_hosts_and_reached_as_clients_at_their_listening_address():
    exposed = inventory_host("gw", ["gateway"], ssh_hostname="10.0.0.2", gateway_bind_address="0.0.0.0")
    pinned = inventory_host("gw2", ["gateway"], ssh_hostname="10.0.0.3", gateway_bind_address="10.1.0.3")
    closed = inventory_host("gw3", ["gateway"], ssh_hostname="10.0.0.4")  # loopback: group_data's default
    other = inventory_host("gw4", ["gateway"], profile="qwen36_ddtree", gateway_bind_address="0.0.0.0")
    worker = inventory_host("w", ["rtx_pro_6000_pcie"], ssh_hostname="10.0.0.5", bind_address="0.0.0.0")
    replica = resolve(worker.data, "rtx_pro_6000_pcie").replicas[0]
    found = routes(fleet([exposed, pinned, closed, other, worker]), worker, replica)
    assert [(r.gateway, r.address, r.port, r.worker_url(replica.port), r.problem) for r in found] == [
        ("gw", "10.0.0.2", 30080, "http://10.0.0.5:30000", None),
        ("gw2", "10.1.0.3", 30080, "http://10.0.0.5:30000", None),
        # Its control plane runs on its own host: a gateway on loopback drains and registers the worker too.
        ("gw3", "", 30080, "http://10.0.0.5:30000", None)]  # gw4 serves another model
    both = inventory_host("both", ["rtx_pro_6000_pcie", "gateway"])  # loopback worker under its own gateway
    own = resolve(both.data, "rtx_pro_6000_pcie").replicas[0]
    assert [(r.address, r.worker_url(own.port), r.problem) for r in routes(fleet([both]), both, own)] == [
        ("127.0.0.1", "http://127.0.0.1:30000", None)]


# gateway_workers.py list's JSON, its worker and readiness values as smg 1.13.0 answered them
# (GET /workers, GET /readiness) for one stand-in worker registered through POST /workers.
CAPTURED_LIST = ('{"reachable": true, "workers": [{"id": "01a22e16-88f1-76c6-92e3-9750c60fde5e", '
                 '"url": "http://127.0.0.1:38321", "status": "ready", "model_id": "lab/m"}], '
                 '"readiness": {"status": "ready", "healthy_workers": 1, "total_workers": 1}}')


def test_gateway_workers_fact_reads_the_listing_and_treats_no_answer_as_unreachable():
    fact = GatewayWorkers()
    listing = fact.process([CAPTURED_LIST])
    assert listing == json.loads(CAPTURED_LIST)
    assert fact.process(["Traceback (most recent call last):", "ConnectionRefusedError"])["reachable"] is False


GATEWAY = resolve_gateway(host_data("gateway", gateway_bind_address="0.0.0.0"))
ROUTE = Route("gw", GATEWAY, "10.0.0.5", "10.0.0.2")
URL = ROUTE.worker_url(30000)
# gateway_workers.py's options as the gateway's host runs it: its own API (its socket owned by its user),
# its admin key and the clients' key it sends the workers, each read there.
ON_GATEWAY = ["--address", "127.0.0.1", "--owner", "smg", "--worker-key-file", GATEWAY.key_file, "30080",
              GATEWAY.admin_key_file]


def listing(*urls: str, reachable: bool = True) -> dict:
    return {"reachable": reachable, "workers": [{"id": f"id-{u}", "url": u, "status": "ready"} for u in urls]}


def worker(**data):
    return resolve(host_data("rtx_pro_6000_pcie", bind_address="0.0.0.0", **data), "rtx_pro_6000_pcie").replicas[0]


def restarting(reason: str | None, refused: str | None = None) -> tuple[unit.Restart, dict]:
    """This run's restart decision of `worker()`, and the facts of a host on which it comes out as `reason`."""
    s = worker()
    unit_text, env_text = unit.unit_files(s, "sglang=3f2a", ())
    written = ("an older unit", "an older env") if reason == unit.FILES_CHANGED else (unit_text, env_text)
    state = dict(unit_sha1=sha1_of(written[0].encode()), env_sha1=sha1_of(written[1].encode()),
                 active="inactive" if reason == unit.STOPPED else "active", enabled="enabled")
    built = {"version": "0.5.23", "fingerprint": fingerprint(s.engine.sglang_requirement, s.engine.service.pip_index_url)}
    return unit.Restart(s, "sglang=3f2a", []), {ServiceState: state, SGLangRejects: refused, VenvRequirement: built,
                                                   NvidiaDriver: None}  # no driver: the control nodes alone


def test_a_restarting_worker_is_drained_on_its_gateways_host_then_waits_for_its_requests_in_flight():
    """The gateway's admin key never leaves its host: the drain's listing is read there, and its command runs
    there (the callback's gateway), reading the worker's /metrics at the URL the gateway reaches it at."""
    d = worker()
    restart, facts = restarting(unit.FILES_CHANGED)
    commands, host = run_host(drain, {**facts, GatewayWorkers: listing(URL, "http://10.0.0.6:30000")},
                              server=d, routes=[ROUTE], restart=restart)
    [command] = commands
    assert command.args[1] == "gw" and ("gw", GatewayWorkers) in host.read
    assert ("host-1", GatewayWorkers) not in host.read
    tail = command.args[0].rsplit("' ", 1)[1]  # after the inline program: the arguments
    assert tail.split() == [*ON_GATEWAY, d.engine.served_model_name, "drain", "120", URL,
                            "--idle", URL, "900"]  # group_data's longest_generation_s
    assert d.engine.service.api_key_file not in command.args[0]


def test_the_last_of_several_gateways_waits_for_the_server_to_go_idle():
    second = Route("gw2", GATEWAY, "10.0.0.5", "10.0.0.3")
    restart, facts = restarting(unit.FILES_CHANGED)
    commands, _ = run(drain, {**facts, GatewayWorkers: listing(URL)}, server=worker(),
                      routes=[ROUTE, second], restart=restart)
    assert ["--idle" in c.args[0].rsplit("' ", 1)[1].split() for c in commands] == [False, True]


def test_a_worker_without_metrics_cannot_drain_and_fails_before_its_restart():
    restart, facts = restarting(unit.FILES_CHANGED)
    commands, _ = run(drain, {**facts, GatewayWorkers: listing(URL)},
                      server=worker(enable_metrics=False), routes=[ROUTE], restart=restart)
    assert "keep enable_metrics=true" in failure(commands)[0]


@pytest.mark.parametrize("reason, refused, listed, why", [
    (None, None, True, "sglang@kimi_k26_dflash-gpu0-7 does not restart"),
    (unit.FILES_CHANGED, "--bad-flag", True, "sglang@kimi_k26_dflash-gpu0-7 does not restart"),  # refused: no restart
    (unit.STOPPED, None, False, "no gateway lists sglang@kimi_k26_dflash-gpu0-7"),
])
def test_no_drain_when_nothing_restarts_or_nothing_lists_the_worker(reason, refused, listed, why):
    restart, facts = restarting(reason, refused)
    commands, noops = run(drain, {**facts, GatewayWorkers: listing(*([URL] if listed else []))},
                          server=worker(), routes=[ROUTE], restart=restart)
    assert commands == [] and noops[0].startswith(why), noops


def test_the_drain_and_the_unit_take_one_decision_and_the_host_validates_once():
    restart, facts = restarting(unit.FILES_CHANGED, refused="--bad-flag")
    _, noops = run(drain, {**facts, GatewayWorkers: listing(URL)}, server=worker(), routes=[ROUTE],
                   restart=restart)
    assert noops == ["sglang@kimi_k26_dflash-gpu0-7 does not restart: it stays in its gateways"]
    # Asked again, this host would fail the test: it answers nothing but the gateway's list.
    commands, _ = run(unit.configure, {GatewayWorkers: listing()}, server=worker(), restart=restart)
    assert "rejects the rendered flags (--bad-flag)" in failure(commands)[0]


def test_a_gateway_the_worker_cannot_reach_fails_the_worker_before_its_restart():
    unreachable = Route("gw3", GATEWAY, "10.0.0.5", problem="w cannot drain itself from gw3")
    restart, facts = restarting(unit.FILES_CHANGED)
    commands, _ = run(drain, facts, server=worker(), routes=[unreachable], restart=restart)
    assert failure(commands) == ["w cannot drain itself from gw3"]


@pytest.mark.parametrize("answer, joins", [
    (listing(), True),  # generates in this run, missing: registered (again, new, or back after a rollback)
    (listing(URL), False),  # already there
    (listing(reachable=False), False),  # no gateway answering: its own stage registers it
])
def test_a_worker_that_generates_joins_each_answering_gateway_that_lacks_it(answer, joins):
    commands, host = run_host(rejoin, {GatewayWorkers: answer}, server=worker(), routes=[ROUTE])
    assert [c.args[0].rsplit("' ", 1)[1].split() for c in commands] == (
        [[*ON_GATEWAY, "kimi-k2.6", "join", "120", URL]] if joins else [])
    assert [c.args[1] for c in commands] == (["gw"] if joins else []) and {h for h, _ in host.read} == {"gw"}


def test_replicas_back_from_a_bench_join_each_gateway_in_one_command():
    """The bench's restore registers the drained replicas with each gateway in one command, which waits for
    them together (smg's success threshold once, not once a replica), after reading its listing once; a
    replica the gateway lists already is left out, and a gateway that does not answer registers them in its
    own stage."""
    replicas = [dataclasses.replace(worker(), port=port, service_name=f"sglang@r{port}") for port in (30000, 30001, 30002)]
    other = Route("gw2", GATEWAY, "10.0.0.5", "10.0.0.3")
    facts = {GatewayWorkers: listing(ROUTE.worker_url(30001))}
    joined = SimpleNamespace(_inner=lambda: iter(joins([(r, [ROUTE, other]) for r in replicas])))
    commands, host = run_host(joined, facts)
    assert [(route.gateway, command.rsplit("' ", 1)[1].split()) for route, command in commands] == [
        (name, [*ON_GATEWAY, "kimi-k2.6", "join", "120", URL, ROUTE.worker_url(30002)]) for name in ("gw", "gw2")]
    assert sorted(name for name, _ in host.read) == ["gw", "gw2"]
    commands, _ = run_host(joined, {GatewayWorkers: listing(reachable=False)})
    assert commands == []


def test_units_no_deployment_wants_leave_every_gateway_listing_them_before_they_stop():
    """The single unit of an earlier layout (port 30000) is listed by the gateway: drained; a retired replica
    no gateway lists is not; a wanted unit listed at the same URL is not retired."""
    units = {"sglang": {"port": 30000, "model": "kimi-k2.6", "loads": []},
             "sglang@kimi_k26_dflash-gpu0-3": {"port": 30000, "model": "kimi-k2.6", "loads": []},
             "sglang@qwen36_ddtree-gpu5": {"port": 30005, "model": "qwen3.6-27b", "loads": []}}
    restart, state = restarting(unit.FILES_CHANGED)  # sglang@kimi_k26_dflash-gpu0-7, wanted
    facts = {**state, unit.ServerUnits: {**units, "sglang@kimi_k26_dflash-gpu0-7": units["sglang"]},
             GatewayWorkers: listing(URL, "http://10.0.0.6:30000")}
    commands, _ = run(drain_retired, facts, replacement=unit.Replacement(worker().engine.service, [restart]), gateways=[ROUTE])
    # Its requests in flight finish first, as a drained replica's do.
    assert [c.args[0].rsplit("' ", 1)[1].split()[-6:] for c in commands] == [
        ["drain", "120", URL, "--idle", URL, "900"]]
    commands, noops = run(drain_retired, {**facts, unit.ServerUnits: {"sglang@kimi_k26_dflash-gpu0-7": {
        "port": 30000, "model": "kimi-k2.6", "loads": []}}}, replacement=unit.Replacement(worker().engine.service, [restart]), gateways=[ROUTE])
    assert commands == [] and noops == ["no gateway lists a unit to retire (none)"]
    # The host's SGLang refuses the new unit: nothing leaves the gateway (unit.retired fails the host).
    refused, state = restarting(unit.FILES_CHANGED, refused="--bad-flag")
    commands, noops = run(drain_retired, {**facts, **state}, replacement=unit.Replacement(worker().engine.service, [refused]), gateways=[ROUTE])
    assert commands == [] and noops == ["the host's SGLang refuses a new unit: nothing is retired"]


def gateway_unit_facts(unit_sha1, active="active", enabled="enabled") -> dict:
    return {ServiceState: dict(unit_sha1=unit_sha1, env_sha1=None, active=active, enabled=enabled),
            SystemdStatus: {"smg.service": active == "active"}, SystemdEnabled: {"smg.service": enabled == "enabled"}}


def test_the_gateway_unit_is_started_through_systemd_service_and_restarted_only_on_its_inputs():
    g = resolve_gateway(host_data("gateway"))
    written = sha1_of(service.unit_text(g, "smg==1.13.0").encode())
    # A new unit's upload (files.put) needs a real host: tests/lab/test_gateway.py writes it.
    stopped, _ = run(service.configure, gateway_unit_facts(written, "inactive", "disabled"), gateway=g,
                     inputs="smg==1.13.0", restart_when=[])
    assert stopped == ["systemctl start smg.service", "systemctl enable smg.service"]
    commands, noops = run(service.configure, gateway_unit_facts(written), gateway=g, inputs="smg==1.13.0",
                          restart_when=[])
    assert commands == [] and noops == ["smg is running its current unit (smg==1.13.0)"]
    assert run(service.configure, gateway_unit_facts(written), gateway=g, inputs="smg==1.13.0",
               restart_when=[ran(changed=True)])[0] == ["systemctl restart smg.service"]


class Named(str):
    """A host as kept_in sees it: a name (hashable, as pyinfra's hosts are)."""

    @property
    def name(self) -> str:
        return str(self)


class RunState(SimpleNamespace):
    """What kept_in reads of pyinfra's state: failed hosts, the inventory, the hosts in this run."""

    def is_host_in_limit(self, h) -> bool:
        return h.name in self.limit


@pytest.mark.parametrize("before, limit, failed, kept", [
    # The gateway lists a and b: both stay, whatever this run deploys.
    ({"reachable": True, "workers": [{"url": "http://a:30000"}, {"url": "http://b:30000"}]}, {"gw"}, set(), ["a", "b"]),
    # b was rolled back in an earlier run: a run of the gateway alone leaves it out...
    ({"reachable": True, "workers": [{"url": "http://a:30000"}]}, {"gw"}, set(), ["a"]),
    # ...a run that deploys b brings it back, unless b fails again.
    ({"reachable": True, "workers": [{"url": "http://a:30000"}]}, {"gw", "b"}, set(), ["a", "b"]),
    ({"reachable": True, "workers": [{"url": "http://a:30000"}]}, {"gw", "b"}, {"b"}, ["a"]),
    # A gateway that did not answer before the run (new, or down) remembers nobody: all but the failed.
    ({"reachable": False, "workers": []}, {"gw"}, {"a"}, ["b"]),
])
def test_the_gateway_keeps_out_a_rolled_back_worker_until_a_run_deploys_it(before, limit, failed, kept):
    from deployment.gateway.membership import Worker
    from operations.gateway.registry import kept_in
    hosts = [Named(n) for n in ("gw", "a", "b")]
    state = RunState(failed_hosts={h for h in hosts if h.name in failed}, inventory=hosts, limit=limit)
    wanted = [Worker("a", "http://a:30000"), Worker("b", "http://b:30000")]
    assert [w.name for w in kept_in(before, wanted, state)] == kept


ADMIN, CLIENT = "admin-key-0123456789abcdef", "client-key-0123456789abcdef"


def admin_key_run(monkeypatch, admin=None, client=None, files=(), **data):
    for name, value in (("SPECFLEET_GATEWAY_ADMIN_KEY", admin), ("SPECFLEET_API_KEY", client)):
        if value:
            monkeypatch.setenv(name, value)
        else:
            monkeypatch.delenv(name, raising=False)
    g = resolve_gateway(host_data("gateway", **data))
    kept = {"kind": "file", "mode": "640", "user": "root", "group": "smg"}
    states = {path: ({**kept, "digest": digest} if path in dict(files) else None)
              for path, digest in [(g.admin_key_file, dict(files).get(g.admin_key_file)),
                                 (g.key_file, dict(files).get(g.key_file))]}
    return g, run(service.admin_key, {FileStates: states}, gateway=g)


def test_a_gateway_with_a_clients_key_needs_an_admin_key_of_its_own(monkeypatch):
    _, (commands, _) = admin_key_run(monkeypatch, client=CLIENT)
    assert failure(commands) == ["host-1: the gateway would let its clients register workers: set "
                                 "$SPECFLEET_GATEWAY_ADMIN_KEY on the controller (16 to 512 characters, not "
                                 "$SPECFLEET_API_KEY)"]
    _, (commands, _) = admin_key_run(monkeypatch, admin=CLIENT, client=CLIENT)
    assert failure(commands) == ["host-1: $SPECFLEET_GATEWAY_ADMIN_KEY is the clients' key ($SPECFLEET_API_KEY): "
                                 "the control plane needs a key of its own"]
    g = resolve_gateway(host_data("gateway"))
    _, (commands, _) = admin_key_run(monkeypatch, admin=CLIENT, files=[(g.key_file, digest_of(CLIENT.encode()))])
    assert "the control plane needs a key of its own" in failure(commands)[0]


def test_an_admin_key_kept_on_the_gateway_equal_to_a_newly_exported_clients_key_is_refused(monkeypatch):
    """Compared by the kept file's digest, read on the host: the clients' key never becomes the control plane's."""
    g = resolve_gateway(host_data("gateway"))
    _, (commands, _) = admin_key_run(monkeypatch, client=CLIENT, files=[(g.admin_key_file, digest_of(CLIENT.encode()))])
    assert failure(commands) == ["host-1: $SPECFLEET_GATEWAY_ADMIN_KEY is the clients' key ($SPECFLEET_API_KEY): "
                                 "the control plane needs a key of its own"]
    _, (commands, _) = admin_key_run(monkeypatch, client=CLIENT, files=[(g.admin_key_file, digest_of(ADMIN.encode()))])
    assert not any(isinstance(c, str) and "needs a key of its own" in c for c in commands)


def test_the_admin_key_is_written_from_stdin_root_s_group_smg_and_kept_without_the_variable(monkeypatch):
    g, (commands, _) = admin_key_run(monkeypatch, admin=ADMIN, client=CLIENT)
    assert commands[0] == "install -d -m 755 -o root -g root /etc/specfleet"
    assert commands[-1].endswith("secret /etc/specfleet smg-admin-key 640 smg") and ADMIN not in " ".join(commands)
    kept = [(g.admin_key_file, "x"), (g.key_file, "y")]
    _, (commands, noops) = admin_key_run(monkeypatch, files=kept)
    assert commands == [] and "kept (remove_api_key=true removes it)" in noops[0]
    # A gateway without a clients' key (loopback, open) needs none.
    _, (commands, noops) = admin_key_run(monkeypatch)
    assert commands == [] and noops


def test_the_gateway_launcher_gives_smg_both_keys_in_process_the_admin_key_as_a_control_plane_key(tmp_path):
    """launch_smg.py run with a stand-in `smg.cli` that prints the argv smg's CLI receives."""
    (tmp_path / "smg").mkdir()
    (tmp_path / "smg" / "__init__.py").write_text("")
    (tmp_path / "smg" / "cli.py").write_text("import json\ndef main(argv):\n    print(json.dumps(argv))\n")
    (tmp_path / "client").write_text(CLIENT + "\n")
    (tmp_path / "admin").write_text(ADMIN)
    launcher = Path(service.__file__).parent / "host_scripts" / "launch_smg.py"
    run_ = subprocess.run([sys.executable, str(launcher), "--port", "30080"], capture_output=True, text=True,
                          env={"PYTHONPATH": str(tmp_path), "SPECFLEET_API_KEY_FILE": str(tmp_path / "client"),
                               "SPECFLEET_ADMIN_KEY_FILE": str(tmp_path / "admin")}, timeout=30)
    assert json.loads(run_.stdout) == ["launch", "--port", "30080", "--api-key", CLIENT,
                                       "--control-plane-api-keys", f"specfleet:deploy:admin:{ADMIN}"]
    args = resolve_gateway(host_data("gateway")).args()
    assert not {"--control-plane-api-keys", "--api-key"} & set(args)  # the unit's argv holds neither


def test_the_gateway_unit_is_confined_with_a_system_call_filter():
    text = service.unit_text(resolve_gateway(host_data("gateway")), "smg==1.13.0")
    for setting in ("SystemCallFilter=@system-service", "SystemCallArchitectures=native", "NoNewPrivileges=yes",
                    "ProtectSystem=strict", "CapabilityBoundingSet=", "MemoryDenyWriteExecute=yes",
                    "PrivateDevices=yes"):
        assert setting in text, setting


def test_no_worker_keeps_a_gateways_admin_key():
    """Its gateways' hosts drain and register it: a key a worker held for them is removed, nothing else is."""
    d = worker()
    held = f"{d.engine.service.config_dir}/{LEGACY_ADMIN_KEY}"
    kept = {"kind": "file", "mode": "640", "user": "root", "group": "root", "sha1": "x"}
    commands, _ = run(no_admin_key, {FileStates: {held: kept}}, service=d.engine.service)
    assert commands == [f"rm -f {held}"]
    commands, noops = run(no_admin_key, {FileStates: {held: None}}, service=d.engine.service)
    assert commands == [] and noops == ["no gateway's admin key on this worker"]


@pytest.mark.parametrize("sudo", [True, False])
def test_a_command_on_the_gateways_host_takes_that_hosts_own_escalation(monkeypatch, sudo):
    """A worker's drain runs on the gateway's host as that host's own operations do (its `_sudo`, the run's
    --sudo), whatever operation the gateway's host is in."""
    from pyinfra.api import Config, Inventory, State
    from operations.basics import shell
    inventory = Inventory(([("gw", {"_sudo": True} if sudo else {})], {}))
    state = State(inventory, Config())
    gw = inventory.get_host("gw")
    seen = []
    monkeypatch.setattr(gw, "run_shell_command", lambda command, **arguments: seen.append(arguments) or (True, None))
    gw.connected = True
    assert shell.run_elsewhere(gw, "true") == (True, None) and state.inventory is inventory
    assert seen[0].get("_sudo", False) is sudo


@pytest.mark.parametrize("reach", ["command", "listing"])
def test_workers_of_one_batch_reaching_the_gateways_host_at_once_connect_it_once(monkeypatch, reach):
    """Two workers in one run reach the gateway's host (outside --limit) at the same moment, by a command
    (the drain) or by reading its listing (a fact, which pyinfra would connect for unlocked): one connection,
    used only once it is made."""
    import threading
    import time
    from pyinfra.api import Config, Inventory, State
    from operations.basics import shell
    from operations.gateway import registry
    inventory = Inventory(([("gw", {})], {}))
    State(inventory, Config())
    monkeypatch.setattr(registry, "state", type("S", (), {"inventory": inventory}))
    gw = inventory.get_host("gw")
    connects, used_before_connected = [], []

    def connect(**_):
        connects.append(1)
        time.sleep(0.2)  # the SSH handshake: the other worker's greenlet runs meanwhile
        gw.connected = True

    def used(*_, **__):
        used_before_connected.append(not gw.connected)
        return (True, None)

    monkeypatch.setattr(gw, "connect", connect)
    monkeypatch.setattr(gw, "run_shell_command", used)
    monkeypatch.setattr(gw, "get_fact", used)
    reaches = {"command": lambda: shell.run_elsewhere(gw, "true"),
               "listing": lambda: registry.listing(ROUTE, GATEWAY.model)}
    workers = [threading.Thread(target=reaches[reach]) for _ in range(2)]
    for thread in workers:
        thread.start()
    for thread in workers:
        thread.join()
    assert connects == [1] and used_before_connected == [False, False]


def test_the_gateways_modules_ask_same_host_loopback_and_urls_of_their_one_definitions():
    """Read from the source of the controller's gateway modules: a host name compared outside
    ``membership.same_host``, loopback typed, or a URL built by hand would be a second answer."""
    import ast
    from deployment.gateway import membership
    here = Path(membership.__file__).parent
    for path in sorted(here.glob("*.py")):
        text = path.read_text()
        assert "127.0.0.1" not in text and "http://{" not in text, path.name  # network.LOOPBACK, network.url
        for function in (n for n in ast.walk(ast.parse(text)) if isinstance(n, ast.FunctionDef)):
            if function.name == "same_host":
                continue
            for compare in (n for n in ast.walk(function) if isinstance(n, ast.Compare)):
                names = [side for side in (compare.left, *compare.comparators)
                         if isinstance(side, ast.Attribute) and side.attr == "name"]
                assert not (names and any(isinstance(op, (ast.Eq, ast.NotEq)) for op in compare.ops)), \
                    f"{path.name}:{compare.lineno} compares host names: ask membership.same_host"


@pytest.mark.parametrize("pin, refused", [("smg==1.13.0", False), ("smg == 1.13.2", False), ("smg==1.14.0", True),
                                          ("SMG===2.0.0", True), ("smg>=1.13", False)])
def test_a_pin_to_an_smg_release_the_worker_sync_does_not_read_is_refused_in_one_line(pin, refused):
    """The sync reads smg 1.13's worker `status`; a pin to another release would never converge, so it is
    refused before anything is installed. A range is left to the listing's own check below."""
    if not refused:
        assert resolve_gateway(host_data("gateway", gateway_requirement=pin)).requirement == pin
        return
    with pytest.raises(BadHostData, match="use smg==1.13.0") as refusal:
        resolve_gateway(host_data("gateway", gateway_requirement=pin))
    assert "\n" not in str(refusal.value)


def test_a_gateway_listing_workers_without_a_status_stops_the_sync_naming_the_versions_it_reads(tmp_path):
    """smg's later listing (is_healthy, no status): the host program says which gateway it reads and exits
    non-zero at once, instead of waiting out its timeout for a status that never comes."""
    import http.server
    import threading

    class NewerSmg(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = json.dumps({"workers": [{"id": "w1", "url": "http://127.0.0.1:30000", "model_id": "m",
                                            "is_healthy": True}]}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), NewerSmg)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    key = tmp_path / "admin-key"
    key.write_text("k" * 32)
    repo = Path(__file__).resolve().parents[2]
    script = repo / "operations/gateway/host_scripts/gateway_workers.py"
    beside = repo / "operations/basics/host_scripts"  # uploaded side by side with it on the host
    try:
        done = subprocess.run([sys.executable, str(script), str(server.server_address[1]), str(key), "m", "sync",
                               "30", "--register", "http://127.0.0.1:30000", "--inventory", "http://127.0.0.1:30000"],
                              capture_output=True, text=True, timeout=20, env={"PYTHONPATH": str(beside)})
    finally:
        server.shutdown()
    assert done.returncode != 0
    assert "lists workers without smg 1.13's `status` field" in done.stderr and "smg==1.13.0" in done.stderr
