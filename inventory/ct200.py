"""The CT200 box: 8x RTX PRO 6000 Blackwell Server Edition on PCIe.

No address is committed: SPECFLEET_CT200_HOST names it, else a `Host ct200` entry of your
SSH config (HostName, User, IdentityFile, ServerAliveInterval for hours-long weight
downloads). Host keys are verified (inventory/ssh_trust.py).
"""

import os

from inventory.ssh_trust import in_ssh_config, ssh_data

if os.environ.get("SPECFLEET_CT200_HOST"):
    _target = os.environ["SPECFLEET_CT200_HOST"]
elif in_ssh_config("ct200"):
    _target = "ct200"
else:
    raise SystemExit("inventory/ct200.py: export SPECFLEET_CT200_HOST=ADDRESS, or add a `Host ct200` "
                     "entry with a HostName to your SSH config")

rtx_pro_6000_pcie = [(_target, ssh_data(user_env="SPECFLEET_CT200_USER", target=_target))]
