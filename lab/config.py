"""Addresses, ports and paths the lab's parts agree on."""

import os
from pathlib import Path

# All lab state lives outside the checkout so that two clones share one built
# root filesystem, and so that `make lab-down` from any clone finds the fleet.
LAB_DIR = Path(os.environ.get("SPECFLEET_LAB_DIR", "/var/lib/specfleet-lab"))

# One bridge joins every host's veth link to the controller. The controller's
# address on it is where the hub and the package index listen.
BRIDGE = "sflab0"
NETWORK = "10.213.0.0/16"
CONTROLLER_IP = "10.213.0.1"
PREFIX_LEN = 16

HUB_PORT = 8800  # Hugging Face-compatible API and resolve endpoints
HUB_CDN_PORT = 8801  # second origin for LFS redirects, like the real hub's CDN
INDEX_PORT = 8802  # PEP 503 package index and plain wheel downloads

HUB_URL = f"http://{CONTROLLER_IP}:{HUB_PORT}"
INDEX_URL = f"http://{CONTROLLER_IP}:{INDEX_PORT}/simple/"
WHEELS_URL = f"http://{CONTROLLER_IP}:{INDEX_PORT}/wheels/"

# Lab tokens: the only tokens that ever appear in this repository.
TOKEN_GRANTED = "hf_lab_granted"  # valid, accepted the gated drafter's terms
TOKEN_DENIED = "hf_lab_denied"  # valid, has not accepted them

# Paths inside a lab host that the stand-ins read.
HOST_LAB_ETC = "/etc/specfleet-lab"
GPU_PROFILE_FILE = f"{HOST_LAB_ETC}/gpu-profile"  # holds one profile name
GPU_PROFILES_DIR = "/usr/share/specfleet-lab/gpu-profiles"
SGLANG_KNOBS_FILE = f"{HOST_LAB_ETC}/sglang-standin.json"
