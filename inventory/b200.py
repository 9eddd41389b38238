"""NVLink B200 nodes (HGX, 8x B200, NVSwitch). Names are addresses or Host entries of your SSH config.

    SPECFLEET_B200_HOSTS="b200-a,b200-b" pyinfra inventory/b200.py deploy.py

One server over these nodes (TP 16 over two; group_data/all.py node_groups), rank 0 the first named:

    SPECFLEET_B200_HOSTS="b200-a,b200-b" SPECFLEET_B200_NODE_GROUP=kimi-tp16 pyinfra inventory/b200.py deploy.py

With SGLang's gateway on a host of its own in front of them (its workers listen beyond loopback,
so they need an API key):

    SPECFLEET_B200_HOSTS="b200-a,b200-b" SPECFLEET_GATEWAY_HOST=gw-1 SPECFLEET_API_KEY=... \
        pyinfra inventory/b200.py deploy.py --data bind_address=0.0.0.0 --data gateway_bind_address=0.0.0.0

Host keys are verified (inventory/ssh_trust.py).
"""

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # importable from anywhere, to say where to run it

from inventory.ssh_trust import gateway as _gateway, ssh_data, targets

_group = os.environ.get("SPECFLEET_B200_NODE_GROUP")
b200_nvlink = [(name, {**ssh_data(target=name), **({"node_group": _group, "node_rank": rank} if _group else {})})
               for rank, name in enumerate(targets("SPECFLEET_B200_HOSTS", "b200-a,b200-b"))]
gateway = _gateway(b200_nvlink)
