"""NVLink B300 nodes (HGX, 8x B300 SXM6 AC, NVSwitch). Names are addresses or Host entries of your SSH config.

    SPECFLEET_B300_HOSTS="b300-a,b300-b" pyinfra inventory/b300.py deploy.py

Host keys are verified (inventory/ssh_trust.py).
"""

from inventory.ssh_trust import ssh_data, targets

b300_nvlink = [(name, ssh_data(target=name)) for name in targets("SPECFLEET_B300_HOSTS", "b300-a,b300-b")]
