"""What an address means for who reaches a server: loopback, the wildcard, a host address, where a process
on the same host reaches a server bound to an address, and a server's URL."""

import ipaddress
import re

# Where a listener only the host itself reaches binds: typed once, in the host programs' module, as the hosts
# run those without the product.
from operations.basics.host_scripts.owned_sockets import LOOPBACK

ADDRESS = re.compile(r"[A-Za-z0-9][A-Za-z0-9.-]*")  # a host name or IPv4 address, nothing a shell reads
WILDCARDS = ("0.0.0.0", "::")  # every address of the host


def is_loopback(address: str) -> bool:
    """Only the host itself reaches a server bound here (127.0.0.0/8, ::1, localhost)."""
    if address == "localhost":
        return True
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False  # a host name: whatever it resolves to on the network


def is_ip(address: str) -> bool:
    """An IP address, not a name: what an allow list (nginx's, systemd's IPAddressAllow=) admits, taken as the
    inventory gives it, never resolved on the controller, where a spoofed answer would join the list."""
    try:
        ipaddress.ip_address(address)
        return True
    except ValueError:
        return False


def local_address(bind_address: str) -> str:
    """Where a process on the same host reaches a server bound to `bind_address`."""
    return LOOPBACK if bind_address in WILDCARDS or is_loopback(bind_address) else bind_address


def inventory_address(inventory_host) -> str:
    """A host's address on the serving network: `gateway_worker_address`, else `ssh_hostname`, else its name."""
    data = inventory_host.data
    return str(data.get("gateway_worker_address") or data.get("ssh_hostname") or inventory_host.name)


def url(address: str, port: int | str) -> str:
    """A server's URL at `address` and `port`: every server a deploy starts (SGLang, smg, Prometheus) serves
    plain HTTP."""
    return f"http://{address}:{port}"
