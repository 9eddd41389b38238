"""NVLink B200 nodes (HGX, 8x B200, NVSwitch). Names are addresses or Host entries of your SSH config.

    SPECFLEET_B200_HOSTS="b200-a,b200-b" pyinfra inventory/b200.py deploy.py

One server over these nodes (TP 16 over two; group_data/all.py node_groups), rank 0 the first named:

    SPECFLEET_B200_HOSTS="b200-a,b200-b" SPECFLEET_B200_NODE_GROUP=kimi-tp16 pyinfra inventory/b200.py deploy.py

Host keys are verified (inventory/ssh_trust.py).
"""

import os

from inventory.ssh_trust import ssh_data, targets

_group = os.environ.get("SPECFLEET_B200_NODE_GROUP")
b200_nvlink = [(name, {**ssh_data(target=name), **({"node_group": _group, "node_rank": rank} if _group else {})})
               for rank, name in enumerate(targets("SPECFLEET_B200_HOSTS", "b200-a,b200-b"))]
