"""What a GPU product is on any host: facts that hold for every card of a name (no pyinfra here).

Used where a host's own outputs do not tell, e.g. classify over captures without `topo -m`.
"""

from __future__ import annotations

import re

# Products built without an NVLink connector: every pair of such GPUs talks over PCIe.
# RTX PRO 6000 Blackwell (all editions, and the China 6000D): NVIDIA's datasheets list no NVLink;
# GeForce RTX 40 and 50 series dropped the NVLink bridge; L4, L40 and L40S have none.
PCIE_ONLY_NAMES = [
    r"^NVIDIA RTX PRO 6000 Blackwell (Server|Workstation|Max-Q Workstation) Edition$",
    r"^NVIDIA RTX (PRO )?6000D\b",
    r"^NVIDIA GeForce RTX [45]0[5-9]0\b",
    r"^NVIDIA L(4|40|40S)$",
]


def named(name: str | None, patterns) -> bool:
    """Whether the GPU name nvidia-smi prints (or a PCI ID's product name) matches one of a class's patterns."""
    return any(re.search(pattern, name or "") for pattern in patterns)


def interconnect_by_product(names: list[str]) -> str | None:
    """'pcie' when every GPU named is a product without NVLink; None when the names do not tell."""
    if names and all(named(name, PCIE_ONLY_NAMES) for name in names):
        return "pcie"
    return None


# PCI device IDs (vendor 10de) -> the name nvidia-smi prints for that product, for hosts that have
# no driver yet (`lspci -n` reads the bus without one). RTX PRO 6000 family: the hosts notes'
# table; 2335: a real H200 host's `nvidia-smi --query-gpu=pci.device_id` (0x233510DE). Products
# whose IDs no source here gives (B200, B300) are not listed: their hosts are checked by count only.
PCI_DEVICE_NAMES = {
    "2bb1": "NVIDIA RTX PRO 6000 Blackwell Workstation Edition",
    "2bb4": "NVIDIA RTX PRO 6000 Blackwell Max-Q Workstation Edition",
    "2bb5": "NVIDIA RTX PRO 6000 Blackwell Server Edition",
    "2bb9": "NVIDIA RTX 6000D",
    "2335": "NVIDIA H200",
}


def name_by_pci_id(vendor_device: str) -> str | None:
    """The product name of `10de:XXXX` (as `lspci -n` prints it), None when this table does not know it."""
    vendor, _, device = vendor_device.lower().partition(":")
    return PCI_DEVICE_NAMES.get(device) if vendor == "10de" else None
