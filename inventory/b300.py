"""Example NVLink B300 nodes (HGX, 8x B300 SXM6 AC, NVSwitch). Names resolve through your SSH config.

    SPECFLEET_B300_HOSTS="b300-a,b300-b" pyinfra inventory/b300.py deploy.py
"""

import os

b300_nvlink = [name for name in os.environ.get("SPECFLEET_B300_HOSTS", "b300-1").split(",") if name]
