"""The running lab fleet (`python -m lab up`), in the same groups as real inventories.

`pyinfra inventory/lab.py deploy.py` therefore deploys exactly as
`pyinfra inventory/ct200.py deploy.py` does; every host here is also in the
`lab` group (pyinfra names a group after the inventory file), whose
group_data/lab.py points the deploy at the lab's hub, index and tiny models.
"""

from lab.fleet import SSH_KEY, read_fleet


def _lab_hosts(host_class: str) -> list:
    return [
        (host.name, {
            "ssh_hostname": host.address,
            "ssh_user": "root",
            "ssh_key": str(SSH_KEY),
            # Lab hosts get fresh host keys whenever they are rebuilt.
            "ssh_strict_host_key_checking": "off",
            "ssh_known_hosts_file": "/dev/null",
        })
        for host in read_fleet()
        if host.host_class == host_class
    ]


rtx_pro_6000_pcie = _lab_hosts("rtx_pro_6000_pcie")
b200_nvlink = _lab_hosts("b200_nvlink")
b300_nvlink = _lab_hosts("b300_nvlink")
