"""NVLink B300 nodes (HGX, 8x B300 SXM6 AC, NVSwitch). Names are addresses or Host entries of your SSH config.

    SPECFLEET_B300_HOSTS="b300-a,b300-b" pyinfra inventory/b300.py deploy.py

SPECFLEET_GATEWAY_HOST adds SGLang's gateway in front of them (inventory/b200.py shows how).
Host keys are verified (inventory/ssh_trust.py).
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # importable from anywhere, to say where to run it

from inventory.ssh_trust import gateway as _gateway, ssh_data, targets

b300_nvlink = [(name, ssh_data(target=name)) for name in targets("SPECFLEET_B300_HOSTS", "b300-a,b300-b")]
gateway = _gateway(b300_nvlink)
