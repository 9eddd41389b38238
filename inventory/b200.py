"""NVLink B200 nodes (HGX, 8x B200, NVSwitch). Names are addresses or Host entries of your SSH config.

    SPECFLEET_B200_HOSTS="b200-a,b200-b" pyinfra inventory/b200.py deploy.py

Host keys are verified (inventory/ssh_trust.py).
"""

from inventory.ssh_trust import ssh_data, targets

b200_nvlink = [(name, ssh_data()) for name in targets("SPECFLEET_B200_HOSTS", "b200-a,b200-b")]
