"""Addresses, ports and paths the lab's parts agree on.

SPECFLEET_LAB_ID (default 0) selects one of several labs that can run side by
side on one machine: each has its own state directory, bridge, subnet and ports.
"""

import os
from pathlib import Path

LAB_ID = int(os.environ.get("SPECFLEET_LAB_ID", "0"))

# Lab state lives outside the checkout so that `make lab-down` from any clone
# finds the fleet. The base root filesystem and the downloaded .debs are shared
# by every lab on the machine (CACHE_DIR): they are only ever read once built.
CACHE_DIR = Path(os.environ.get("SPECFLEET_LAB_CACHE", "/var/lib/specfleet-lab"))
LAB_DIR = CACHE_DIR / f"lab{LAB_ID}"

# One bridge joins every host's veth link to the controller. The controller's
# address on it is where the hub and the package index listen.
BRIDGE = f"sflab{LAB_ID}"
SUBNET = f"10.{213 + LAB_ID}"
CONTROLLER_IP = f"{SUBNET}.0.1"
PREFIX_LEN = 16

_PORTS = 8800 + 10 * LAB_ID
HUB_PORT = _PORTS  # Hugging Face-compatible API and resolve endpoints
HUB_CDN_PORT = _PORTS + 1  # second origin for LFS redirects, like the real hub's CDN
INDEX_PORT = _PORTS + 2  # PEP 503 package index and plain wheel downloads
APT_PORT = _PORTS + 3  # the stand-in NVIDIA apt repository (lab/apt_repo.py)

HUB_URL = f"http://{CONTROLLER_IP}:{HUB_PORT}"
INDEX_URL = f"http://{CONTROLLER_IP}:{INDEX_PORT}/simple/"
WHEELS_URL = f"http://{CONTROLLER_IP}:{INDEX_PORT}/wheels/"
# Laid out like https://developer.download.nvidia.com/compute/cuda/repos (<os release>/<arch>/).
APT_URL = f"http://{CONTROLLER_IP}:{APT_PORT}/compute/cuda/repos"
# The lab hosts' Debian mirror on the same server (Debian's real packages: lab/apt_repo.py).
DEBIAN_URL = f"http://{CONTROLLER_IP}:{APT_PORT}/debian"

# Lab tokens: the only tokens that ever appear in this repository.
TOKEN_GRANTED = "hf_lab_granted"  # valid, accepted the gated drafter's terms
TOKEN_DENIED = "hf_lab_denied"  # valid, has not accepted them

# Paths inside a lab host that the stand-ins read.
HOST_LAB_ETC = "/etc/specfleet-lab"
GPU_PROFILE_FILE = f"{HOST_LAB_ETC}/gpu-profile"  # holds one profile name
GPU_PROFILES_DIR = "/usr/share/specfleet-lab/gpu-profiles"
SGLANG_KNOBS_FILE = f"{HOST_LAB_ETC}/sglang-standin.json"
