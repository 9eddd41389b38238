"""The gateway hosts (inventory group `gateway`) as deployed: smg running, every inventory worker registered,
Prometheus scraping every worker and smg.

    pytest tests/deployed/test_gateway.py --inventory lab/inventory.py

Runs once per gateway host; an inventory without one has nothing to check here.
"""

import json
import shlex

from deployment import network
from deployment.gateway.config import resolve as resolve_gateway
from deployment.gateway.membership import resolve as fleet, workers
from deployment.monitoring.config import resolve as resolve_monitoring
from operations.monitoring.prometheus import PrometheusTargets, down_targets, scrape_targets
from operations.server.host_scripts.engine_answers import generated
from tests.deployed.test_unit import loose_units

# Runs on the gateway host as root: the key is read there, from the gateway's root-owned 0640 file.
ASK_THROUGH_GATEWAY = r"""
import json, pathlib, sys, urllib.request
port, key_file, model = sys.argv[1:4]
key = pathlib.Path(key_file).read_text().strip() if pathlib.Path(key_file).is_file() else ""
body = {"model": model, "messages": [{"role": "user", "content": "specfleet gateway check"}], "max_tokens": 8}
request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json", "Authorization": f"Bearer {key}"})
with urllib.request.urlopen(request, timeout=60) as response:
    print(json.dumps({"status": response.status, "body": json.loads(response.read())}))
"""


def gateway_of(gateway_target):
    return resolve_gateway(gateway_target.host.data)


def inventory_workers(gateway_target, deployed_inventory):
    inventory, _ = deployed_inventory
    host = inventory[gateway_target.name]
    return workers(fleet(inventory.values()), host, gateway_of(gateway_target).model)


def registered(gateway_target) -> dict:
    g = gateway_of(gateway_target)
    return gateway_target.memo("gateway workers", lambda: json.loads(gateway_target.run(
        shlex.join(["python3", g.script, "--address", g.local_address, "--owner", g.user, str(g.port),
                    g.admin_key_file, g.model, "list"])).stdout))


def test_gateway_unit_is_enabled_and_active(gateway_target):
    g = gateway_of(gateway_target)
    unit = gateway_target.testinfra.service(g.service_name)
    assert unit.is_enabled and unit.is_running, f"{gateway_target.name}: expected {g.service_name} enabled and active"


def test_gateway_readiness_counts_every_inventory_worker_healthy(gateway_target, deployed_inventory):
    expected = len(inventory_workers(gateway_target, deployed_inventory))
    readiness = registered(gateway_target).get("readiness", {})
    assert (readiness.get("status"), readiness.get("healthy_workers")) == ("ready", expected), \
        f"{gateway_target.name}: expected /readiness ready with {expected} healthy workers, found {readiness}"


def test_every_inventory_worker_is_registered_and_ready(gateway_target, deployed_inventory):
    expected = {w.url: "ready" for w in inventory_workers(gateway_target, deployed_inventory)}
    found = {w["url"]: w["status"] for w in registered(gateway_target)["workers"]}
    assert found == expected, f"{gateway_target.name}: expected the gateway's workers {expected}, found {found}"


def test_a_request_through_the_gateway_answers(gateway_target):
    g = gateway_of(gateway_target)
    answer = gateway_target.python(ASK_THROUGH_GATEWAY, str(g.port), g.key_file, g.model)
    assert answer["status"] == 200 and generated(answer["body"]), \
        f"{gateway_target.name}: expected a completion through the gateway, found {answer}"


def test_prometheus_scrapes_every_inventory_worker_and_smg_all_up(gateway_target, deployed_inventory):
    m = resolve_monitoring(gateway_target.host.data)
    wanted = scrape_targets(gateway_target.name, gateway_of(gateway_target),
                            inventory_workers(gateway_target, deployed_inventory))
    found = gateway_target.facts(targets=(PrometheusTargets(), {"address": m.api_address, "port": m.port}))["targets"]
    down = down_targets(found, wanted)
    assert not down, f"{gateway_target.name}: expected Prometheus's {len(wanted)} targets up, found " + "; ".join(down)


# Runs on the gateway host as root: the control plane answers its admin key and refuses the clients' key
# (smg 1.13.0 with control-plane keys); a POST with the clients' key must not register anything.
CONTROL_PLANE = r"""
import json, pathlib, sys, urllib.error, urllib.request
address, port, key_file, admin_key_file = sys.argv[1:5]
def status(method, key_file, body=None):
    path = pathlib.Path(key_file)
    key = path.read_text().strip() if path.is_file() else ""
    request = urllib.request.Request(f"http://{address}:{port}/workers", method=method,
                                     data=None if body is None else json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json", "Authorization": f"Bearer {key}"})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code
    except OSError as error:  # nothing answers
        return str(getattr(error, "reason", error))
print(json.dumps({"client_post": status("POST", key_file, {"url": "http://192.0.2.1:30000"}),
                  "client_get": status("GET", key_file), "admin_get": status("GET", admin_key_file)}))
"""


def test_only_the_admin_key_registers_workers(gateway_target):
    """A client's key must not register a worker of its own (which would receive others' prompts). A gateway
    without keys (no admin key on the controller) is one only its own host reaches: on loopback."""
    g = gateway_of(gateway_target)
    if gateway_target.run(f"test -e {shlex.quote(g.admin_key_file)}").rc != 0:
        assert network.is_loopback(g.bind_address), (
            f"{gateway_target.name}: expected a gateway without an admin key to listen on loopback, found "
            f"{g.bind_address}")
        return
    answer = gateway_target.python(CONTROL_PLANE, g.local_address, str(g.port), g.key_file, g.admin_key_file)
    assert answer == {"client_post": 401, "client_get": 401, "admin_get": 200}, (
        f"{gateway_target.name}: expected the gateway's /workers to refuse the clients' key (401) and answer the "
        f"admin key, found {answer}")


def test_the_gateway_and_prometheus_units_are_confined(gateway_target):
    g = gateway_of(gateway_target)
    loose = loose_units(gateway_target, (f"{g.service_name}.service", "prometheus.service"))
    assert not loose, loose


def test_prometheus_listens_only_where_group_data_says(gateway_target):
    """It has no key: loopback unless prometheus_listen_address says otherwise."""
    m = resolve_monitoring(gateway_target.host.data)
    sockets = gateway_target.run("ss -Hltnp").stdout.splitlines()
    listening = sorted(line.split()[3] for line in sockets if '(("prometheus",' in line)
    assert listening == [f"{m.listen_address}:{m.port}"], \
        f"{gateway_target.name}: expected Prometheus listening on {m.listen_address}:{m.port} only, found {listening}"
