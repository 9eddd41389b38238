"""The running lab fleet (`python -m lab up`), in the same class groups as real inventories.

    pyinfra lab/inventory.py deploy.py

deploys exactly as `pyinfra inventory/ct200.py deploy.py` does. Every host here is also in
the `lab` group, whose data (lab/group_data/lab.py, which pyinfra loads because it sits
next to this inventory) points the deploy at the lab's hub, index and tiny models.

SPECFLEET_LAB_NODE_GROUP=lab-b200-1,lab-b200-2 makes those hosts one server over two nodes (the
lab's node group `lab-tp16`, lab/group_data/lab.py), ranks in the order named.
SPECFLEET_LAB_PROFILES=lab-pcie-2=qwen36_ddtree,... gives those hosts another profile than
group_data's (a fleet serving two models), as a real inventory's host data would.
SPECFLEET_LAB_DEPLOYMENTS='{"lab-pcie-1": [{"profile": "kimi_k26_dflash", "gpus": [0, 1, 2, 3],
"tp_size": 4}, {"profile": "qwen36_ddtree", "gpus": [4, 5, 6, 7]}]}' (JSON) gives those hosts several
deployments, as a real inventory's `deployments` host data would (two models on one host).

A lab with a gateway host (`make demo`) is a fleet: the gateway reaches each worker over the lab
network, so workers and gateway listen there (and the deploy then asks for an API key:
SPECFLEET_API_KEY on the first deploy, kept by the hosts after it, and for the gateway's
control-plane key, SPECFLEET_GATEWAY_ADMIN_KEY, kept the same way). Without a gateway the lab keeps
the product's loopback default: its tests reach each server over SSH on its own host.
"""

import json
import os

from lab.fleet import SSH_KEY, read_fleet
from deployment import site_data

_fleet = read_fleet()
_group = [name for name in os.environ.get("SPECFLEET_LAB_NODE_GROUP", "").split(",") if name]
_profiles = dict(entry.split("=", 1) for entry in os.environ.get("SPECFLEET_LAB_PROFILES", "").split(",") if entry)
_deployments = json.loads(os.environ.get("SPECFLEET_LAB_DEPLOYMENTS") or "{}")
_fleet_behind_gateway = any(host.host_class == "gateway" for host in _fleet)

for _host_class in (*site_data.host_classes(), "gateway"):  # gateway: GPU-less smg hosts
    globals()[_host_class] = [
        (host.name, {
            "ssh_hostname": host.address,
            "ssh_user": "root",
            "ssh_key": str(SSH_KEY),
            # Lab hosts get fresh host keys whenever they are rebuilt.
            "ssh_strict_host_key_checking": "off",
            "ssh_known_hosts_file": "/dev/null",
            **({"node_group": "lab-tp16", "node_rank": _group.index(host.name)} if host.name in _group else {}),
            **({"profile": _profiles[host.name]} if host.name in _profiles else {}),
            **({"deployments": _deployments[host.name]} if host.name in _deployments else {}),
            **({"bind_address": "0.0.0.0", "gateway_bind_address": "0.0.0.0"} if _fleet_behind_gateway else {}),
        })
        for host in _fleet
        if host.host_class == _host_class
    ]

lab = [host.name for host in _fleet]
