"""Example NVLink B200 nodes (HGX, 8x B200, NVSwitch). Names resolve through your SSH config.

    SPECFLEET_B200_HOSTS="b200-a,b200-b" pyinfra inventory/b200.py deploy.py
"""

import os

b200_nvlink = [name for name in os.environ.get("SPECFLEET_B200_HOSTS", "b200-1").split(",") if name]
