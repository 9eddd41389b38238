"""logs.py: which units' journal a host shows, and journal lines with their control characters escaped."""

import runpy

import pytest

from deployment.knobs import BadHostData
from operations import logs, status
from operations.basics.host_programs import HOST_SCRIPTS
from tests.unit.test_status import fleet


def test_a_host_shows_every_unit_its_data_gives_it_or_the_one_named():
    inventory = fleet()
    views = {h.name: status.view_of(h, inventory) for h in inventory}
    unit = views["pcie-1"].replicas[0].service_name
    assert logs.units(views["pcie-1"], None) == [unit]
    assert logs.units(views["gw-1"], None) == ["smg"] and logs.units(views["gw-1"], "smg") == ["smg"]
    with pytest.raises(BadHostData, match=f"replica='smg' is no unit of pcie-1: use one of {unit}"):
        logs.units(views["pcie-1"], "smg")
    with pytest.raises(BadHostData, match="replica='x; reboot' is no unit of pcie-1"):
        logs.units(views["pcie-1"], "x; reboot")


def test_journal_lines_reach_the_terminal_with_their_control_characters_escaped():
    journal = runpy.run_path(str(HOST_SCRIPTS["journal"]))
    assert journal["escaped"]("\x1b[2Jcleared\ttab\r\x07") == "\\x1b[2Jcleared\ttab\\r\\x07"
    assert journal["escaped"]("plain: é, 漢字") == "plain: é, 漢字"
    # smg's coloured level and fields: the colours dropped, the text kept; any other sequence still escaped.
    assert journal["escaped"]("\x1b[2m2026-12-07T13:40:01Z\x1b[0m \x1b[32m INFO\x1b[0m \x1b[2msmg::server\x1b[0m: up") == \
        "2026-12-07T13:40:01Z  INFO smg::server: up"
    assert journal["escaped"]("\x1b[1;31mred\x1b[0m\x1b]0;title\x07") == "red\\x1b]0;title\\x07"
