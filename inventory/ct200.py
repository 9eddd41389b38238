"""The CT200 box: 8x RTX PRO 6000 Blackwell Server Edition on PCIe.

    pyinfra inventory/ct200.py deploy.py                        # a root login
    SPECFLEET_SSH_USER=ops pyinfra inventory/ct200.py deploy.py --sudo
    SPECFLEET_GATEWAY_HOST=ct200 pyinfra inventory/ct200.py deploy.py   # with SGLang's gateway on the box

No address is committed: SPECFLEET_CT200_HOST names it, else a `Host ct200` entry of your
SSH config (HostName, User, IdentityFile, ServerAliveInterval for hours-long weight
downloads). The user: SPECFLEET_CT200_USER, else SPECFLEET_SSH_USER, else your SSH config's.
Host keys are verified (inventory/ssh_trust.py).
"""

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # importable from anywhere, to say where to run it

from inventory.ssh_trust import gateway as _gateway, in_ssh_config, ssh_data

if os.environ.get("SPECFLEET_CT200_HOST"):
    _target = os.environ["SPECFLEET_CT200_HOST"]
elif in_ssh_config("ct200"):
    _target = "ct200"
else:
    raise SystemExit("inventory/ct200.py: export SPECFLEET_CT200_HOST=ADDRESS, or add a `Host ct200` "
                     "entry with a HostName to your SSH config")

rtx_pro_6000_pcie = [(_target, ssh_data("SPECFLEET_CT200_USER", target=_target))]
gateway = _gateway(rtx_pro_6000_pcie)
