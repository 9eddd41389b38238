"""The lab's host classes: its own table of short names and address octets (lab/fleet.py), each a class
of the product's (deployment.site_data.host_classes) or the GPU-less gateway."""

import importlib
from pathlib import Path

from lab import fleet
from lab.config import SUBNET
from deployment import site_data

GPU_PROFILES = Path(__file__).resolve().parents[2] / "lab" / "gpu_standin" / "profiles"
SPEC = "pcie=1,b200=1,b300=1,h100=1,h200=1,gateway=1"
ADDRESSES = {"lab-pcie-1": f"{SUBNET}.1.10", "lab-b200-1": f"{SUBNET}.2.10", "lab-b300-1": f"{SUBNET}.3.10",
             "lab-h100-1": f"{SUBNET}.4.10", "lab-h200-1": f"{SUBNET}.5.10", "lab-gateway-1": f"{SUBNET}.9.10"}


def addresses() -> dict[str, str]:
    return {host.name: host.address for host in fleet.parse_spec(SPEC)}


def test_each_product_class_is_a_lab_class_with_an_octet_and_a_gpu_profile_of_its_own():
    classes = [host_class for host_class, _profile, _octet in fleet.CLASSES.values()]
    assert set(classes) - {"gateway"} == set(site_data.host_classes())
    for host_class, profile, _octet in fleet.CLASSES.values():
        assert host_class == "gateway" or (GPU_PROFILES / profile / "profile.json").is_file(), profile
    octets = [octet for _class, _profile, octet in fleet.CLASSES.values()]
    assert len(set(octets)) == len(octets)


def test_a_host_class_added_to_the_product_shifts_no_lab_address(monkeypatch):
    assert addresses() == ADDRESSES
    known = site_data.host_classes()
    monkeypatch.setattr(site_data, "host_classes", lambda: ("a100_sxm", *known))
    try:
        importlib.reload(fleet)
        assert addresses() == ADDRESSES
    finally:
        monkeypatch.undo()
        importlib.reload(fleet)



def test_the_lab_inventory_holds_no_list_or_tuple_but_its_groups_of_hosts():
    """pyinfra takes every list or tuple an inventory file holds for a group of (host, data)."""
    from lab import inventory
    held = {name for name, value in vars(inventory).items() if isinstance(value, (list, tuple))
            and not name.startswith("_")}
    assert held == {"lab", "gateway", *site_data.host_classes()}
