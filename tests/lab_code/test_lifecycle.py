"""`python -m lab up` is idempotent and `down` leaves nothing behind. Runs last: it tears the lab down."""

import subprocess
import pytest

from lab import fleet, services
from lab.config import BRIDGE, LAB_DIR
from tests.helpers import lab_cli

pytestmark = pytest.mark.lab_lifecycle


def test_up_twice_leaves_the_same_two_hosts_then_down_leaves_nothing():
    lab_cli("up", "--hosts", fleet.DEFAULT_SPEC)
    first = {h.name: fleet._pid(h) for h in fleet.read_fleet()}
    lab_cli("up", "--hosts", fleet.DEFAULT_SPEC)
    second = {h.name: fleet._pid(h) for h in fleet.read_fleet()}
    assert first == second and len(second) == 2, "a second `up` rebooted or changed hosts"
    status = lab_cli("status").stdout
    assert status.count("running") >= 2 + len(services.SERVICES), status  # two hosts plus the servers

    lab_cli("down")
    machines = [h.machine for h in fleet.parse_spec(fleet.DEFAULT_SPEC)]  # this lab's, not another lab's
    nspawn = subprocess.run(["pgrep", "-f", f"systemd-nspawn.*--machine=({'|'.join(machines)}) "], capture_output=True)
    assert nspawn.stdout == b"", "an nspawn process outlived `down`"
    links = [line.split()[0].split("@")[0] for line in
             subprocess.run(["ip", "-br", "link"], capture_output=True, text=True).stdout.splitlines()]
    assert BRIDGE not in links and not {f"vb-{m}"[:15] for m in machines} & set(links), links
    assert set(services.status().values()) == {"stopped"}
    assert not fleet.HOSTS_DIR.exists() or not any(fleet.HOSTS_DIR.iterdir()), "host roots left"
    # Nothing of the lab is left: no gpg-agent of its apt repository's key, no state directory.
    agents = subprocess.run(["pgrep", "-f", f"gpg-agent --homedir {services.APT_DIR}/gnupg"], capture_output=True)
    assert agents.stdout == b"", "the apt repository's gpg-agent outlived `down`"
    assert not LAB_DIR.exists(), f"{LAB_DIR} left"
