"""The CT200 box: 8x RTX PRO 6000 Blackwell Server Edition on PCIe.

No address is committed: `ct200` resolves through your SSH config (a `Host ct200`
entry with HostName, User, IdentityFile), or set SPECFLEET_CT200_HOST / _USER.
"""

import os

rtx_pro_6000_pcie = [
    (os.environ.get("SPECFLEET_CT200_HOST", "ct200"), {
        "ssh_user": os.environ.get("SPECFLEET_CT200_USER", "root"),
        # Hours-long waits on the weights: keep the connection alive through NAT and firewalls.
        "ssh_paramiko_connect_kwargs": {"banner_timeout": 60},
    }),
]
