"""status.py's table from given facts: each host's resolved data and what its host program read."""

import json

from operations import status
from tests.unit.test_gateway import inventory_host

COMMIT, DRAFT = "4f1a2b3c" + "0" * 32, "9d8e7f6a" + "1" * 32


def fleet():
    return [inventory_host("pcie-1", ["rtx_pro_6000_pcie"], ssh_hostname="10.0.0.1", bind_address="0.0.0.0"),
            inventory_host("pcie-2", ["rtx_pro_6000_pcie"], ssh_hostname="10.0.0.2", bind_address="0.0.0.0"),
            inventory_host("b200-1", ["b200_nvlink"], port="30000; reboot"),
            inventory_host("gw-1", ["gateway"], ssh_hostname="10.0.0.9", gateway_bind_address="0.0.0.0")]


def running(port: int, **more) -> dict:
    return {"port": port, "model": "kimi-k2.6", "loads": [f"/srv/specfleet/models/a--b/{COMMIT}",
                                                         f"/srv/specfleet/models/c--d/{DRAFT}"],
            "active": "active", "sub": "running", "since": "Tue 2026-12-01 23:10:04 UTC", "restarts": 0,
            "version": "0.5.23", "accept_length": 3.2, **more}


def read(views, gateway_workers: list[dict], gateway_reachable: bool = True) -> dict:
    unit = views["pcie-1"].replicas[0].service_name
    return {"pcie-1": {"units": {unit: running(30000), "sglang@qwen36_ddtree-gpu0": {**running(30001),
                                                                                    "active": "inactive",
                                                                                    "sub": "dead"}},
                       "gateway": None},
            "pcie-2": {"units": {}, "gateway": None},
            "gw-1": {"units": {}, "gateway": {"active": "active", "sub": "running", "since": "Tue 2026-12-01 23:12:00 UTC",
                                              "restarts": 1, "reachable": gateway_reachable,
                                              "readiness": {"healthy_workers": 1, "total_workers": 1},
                                              "workers": gateway_workers}}}


def test_each_unit_is_one_record_with_its_state_weights_version_endpoint_membership_and_accept_length():
    inventory = fleet()
    views = {h.name: status.view_of(h, inventory) for h in inventory}
    unit = views["pcie-1"].replicas[0].service_name
    seen = read(views, [{"url": "http://10.0.0.1:30000", "status": "ready", "id": "1", "model_id": "kimi-k2.6"}])
    found = status.records(list(views.values()), seen, status.memberships(inventory, views, seen))
    by = {(r["host"], r["unit"]): r for r in found}
    mine = by["pcie-1", unit]
    assert mine == {"host": "pcie-1", "class": "rtx_pro_6000_pcie", "deployment": "kimi_k26_dflash", "unit": unit,
                    "state": "active (running)", "weights": "4f1a2b3c+9d8e7f6a", "sglang": "0.5.23",
                    "endpoint": "http://10.0.0.1:30000", "gateway": "ready", "accept_length": 3.2,
                    "last_start": "Tue 2026-12-01 23:10:04 UTC"}
    # A unit on the host that no deployment of its data wants is shown as such, not hidden.
    assert by["pcie-1", "sglang@qwen36_ddtree-gpu0"]["deployment"] == "(none wants it)"
    assert by["pcie-1", "sglang@qwen36_ddtree-gpu0"]["state"] == "inactive (dead)"
    # A wanted replica with no unit on its host: not deployed, and not in the gateway.
    assert by["pcie-2", unit]["state"] == "not deployed" and by["pcie-2", unit]["gateway"] == "absent"
    assert by["b200-1", None]["state"].startswith("refused: port='30000; reboot'")
    gateway = by["gw-1", "smg"]
    assert gateway["class"] == "gateway" and gateway["state"] == "active (running), 1 restarts"
    assert gateway["gateway"] == "1/1 workers healthy" and gateway["endpoint"] == "http://10.0.0.9:30080"
    lines = status.table(found)
    assert lines[0].split() == ["host", "class", "deployment", "unit", "state", "weights", "sglang", "endpoint",
                                "gateway", "accept", "length", "last", "start"]
    assert len(lines) == 1 + len(found)
    column = lines[0].index("sglang")  # every row's cells start under their header
    assert all(line[column:].startswith(("0.5.23", "-")) for line in lines[1:] if len(line) > column)


def test_membership_is_failed_absent_or_unknown_as_the_gateway_lists_it():
    inventory = fleet()
    views = {h.name: status.view_of(h, inventory) for h in inventory}
    unit = views["pcie-1"].replicas[0].service_name

    def pcie_1(workers, reachable=True):
        seen = read(views, workers, reachable)
        found = status.records(list(views.values()), seen, status.memberships(inventory, views, seen))
        return next(r["gateway"] for r in found if r["host"] == "pcie-1" and r["unit"] == unit)

    listed = {"url": "http://10.0.0.1:30000", "id": "1", "model_id": "kimi-k2.6"}
    assert pcie_1([{**listed, "status": "failed"}]) == "failed (failed)"
    assert pcie_1([{**listed, "url": "http://10.0.0.1:30005", "status": "ready"}]) == "absent"
    assert pcie_1([], reachable=False) == "unknown (gateway unread)"
    # The gateway's host not read at all (unreachable): every record of it and its members' says so.
    seen = {**read(views, []), "gw-1": None}
    found = status.records(list(views.values()), seen, status.memberships(inventory, views, seen))
    assert next(r for r in found if r["host"] == "gw-1")["state"] == "unreachable"
    assert next(r["gateway"] for r in found if r["unit"] == unit and r["host"] == "pcie-1") == \
        "unknown (gateway unread)"


def test_status_reads_every_fact_of_a_host_in_the_host_state_program():
    """One round trip: each fact status reads names the host program that answers it."""
    from operations.basics import gathering
    inventory = fleet()
    for h in inventory:
        view = status.view_of(h, inventory)
        assert all(gathering.answer_of(fact) for fact, _ in status.wanted(view))


def test_what_a_server_or_gateway_answered_prints_escaped_never_as_terminal_control():
    inventory = fleet()
    views = {h.name: status.view_of(h, inventory) for h in inventory}
    unit = views["pcie-1"].replicas[0].service_name
    seen = read(views, [{"url": "http://10.0.0.1:30000", "status": "ready\x1b[2J", "id": "1", "model_id": "kimi"}])
    seen["pcie-1"]["units"][unit] = running(30000, version="0.5.23\x1b]0;owned\x07", accept_length="3.2\r\x1b[1A",
                                            since="Tue\u202e 2026")
    seen["gw-1"]["gateway"]["readiness"] = {"healthy_workers": "1\x1b[31m", "total_workers": "1\n"}
    found = status.records(list(views.values()), seen, status.memberships(inventory, views, seen))
    text = "\n".join(status.table(found))
    assert not any(c in text for c in "\x1b\x07\r\u202e") and len(text.splitlines()) == 1 + len(found)
    assert "0.5.23\\x1b]0;owned\\x07" in text and "3.2\\r\\x1b[1A" in text and "Tue\\u202e 2026" in text
    assert "failed (ready\\x1b[2J)" in text and "1\\x1b[31m/1\\n workers healthy" in text
    # --data json=true: JSON's own escapes (json.dumps writes every control character as \\uXXXX).
    assert not any(c in json.dumps(found) for c in "\x1b\x07\r\u202e")
