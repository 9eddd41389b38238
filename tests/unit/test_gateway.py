"""The gateway's data, arguments and worker list, facts in and values out (no hosts)."""

import json
from types import SimpleNamespace

import pytest

from operations.gateway import GatewayWorkers, resolve_gateway, workers
from tests.unit.group_data import host_data


class InventoryHost(SimpleNamespace):
    """What gateway.workers() reads of a pyinfra host: name, groups, data (attributes and .get)."""


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
                                        ("gateway_bind_address", "0.0.0.0 --api-key x")])
def test_a_value_that_would_reach_the_unit_file_unchecked_is_refused(key, value):
    with pytest.raises(ValueError, match=key):
        resolve_gateway(host_data("gateway", **{key: value}))


def test_workers_are_the_inventory_hosts_serving_the_gateways_model_at_their_network_address():
    gateway = inventory_host("gw", ["gateway"])
    inventory = [
        gateway,
        inventory_host("a", ["rtx_pro_6000_pcie"], ssh_hostname="10.0.0.5", bind_address="0.0.0.0"),
        inventory_host("b", ["b200_nvlink"], gateway_worker_address="b.internal", ssh_hostname="10.0.0.6",
                       bind_address="0.0.0.0"),
        inventory_host("other-model", ["rtx_pro_6000_pcie"], profile="qwen36_ddtree", bind_address="0.0.0.0"),
    ]
    found = workers(inventory, gateway, resolve_gateway(gateway.data).model)
    assert [(w.name, w.url, w.problem) for w in found] == [
        ("a", "http://10.0.0.5:30000", None), ("b", "http://b.internal:30000", None)]


def test_a_loopback_worker_on_another_host_is_a_problem_and_on_the_gateways_own_host_is_not():
    both = inventory_host("both", ["rtx_pro_6000_pcie", "gateway"], bind_address="127.0.0.1")
    apart = inventory_host("apart", ["rtx_pro_6000_pcie"], ssh_hostname="10.0.0.7", bind_address="127.0.0.1")
    found = {w.name: w for w in workers([both, apart], both, resolve_gateway(both.data).model)}
    assert found["both"].url == "http://127.0.0.1:30000" and found["both"].problem is None
    assert "serves on 127.0.0.1 only" in found["apart"].problem


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
