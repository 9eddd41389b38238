"""LAB STAND-IN for the TCP listeners SGLang 0.5.23 opens beyond its HTTP port on one node: the TCPStore
and each scheduler's Gloo device.

The port (srt/server_args.py PortArgs.init_new): --nccl-port, else a random free one in 22000-29999
below the kernel's ephemeral range, tested by binding 0.0.0.0 and released (srt/utils/network.py
get_free_port_below_ephemeral), so two servers starting together can draw the same. TP rank 0's
scheduler then starts torch.distributed's TCPStore on tcp://--host:port (srt/distributed/bootstrap.py
_resolve_dist_init_method). torch 2.14.1, the version 0.5.23 pins, listens on every address whatever
that host is (measured: TCPStore("127.0.0.1", port, is_master=True) listens on *:port, the IPv6
wildcard taking IPv4 too; its libuv daemon binds "::", else "0.0.0.0"). A port in use fails the
scheduler with torch's DistNetworkError. With --nnodes > 1 the store is node 0's dist-init port
(sglang/rendezvous.py).

Every scheduler builds a Gloo CPU group, even alone (srt/distributed/parallel_state.py GroupCoordinator:
new_group(backend="gloo")), whose device listens on an ephemeral port of GLOO_SOCKET_IFNAME's address,
else of the address the host name resolves to (measured with torch 2.14.1: a one-rank Gloo group
listened on 127.0.0.1 where the host name resolved there).
"""

import fcntl
import os
import random
import socket
import struct
from pathlib import Path

RANDOM_PORTS = (22000, 29999)


def store_port(nccl_port: int | None) -> int:
    """The port the server's TCPStore takes (get_free_port_below_ephemeral)."""
    if nccl_port is not None:
        return nccl_port
    ephemeral = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    low, high = RANDOM_PORTS[0], min(RANDOM_PORTS[1], ephemeral - 1)
    for port in random.sample(range(low, high + 1), 64):
        try:
            with socket.create_server(("0.0.0.0", port)):
                return port
        except OSError:
            continue
    raise OSError("no free port below the ephemeral range")


def listen_store(port: int) -> socket.socket:
    """The TCPStore daemon's socket, on every address as torch's is; its error when the port is taken."""
    try:
        try:
            return socket.create_server(("::", port), family=socket.AF_INET6, dualstack_ipv6=True, backlog=4096)
        except OSError as error:
            if error.errno == 98:  # EADDRINUSE: torch does not fall back then
                raise
            return socket.create_server(("0.0.0.0", port), backlog=4096)
    except OSError as error:
        raise RuntimeError(f"torch.distributed.DistNetworkError: The server socket has failed to listen on any "
                           f"local network address. port: {port}, useIpv6: false, code: -{error.errno}, "
                           f"name: {os.strerror(error.errno)}") from None


def interface_address(name: str) -> str:
    """An interface's IPv4 address (SIOCGIFADDR)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        answer = fcntl.ioctl(probe.fileno(), 0x8915, struct.pack("256s", name[:15].encode()))
    return socket.inet_ntoa(answer[20:24])


def listen_gloo() -> socket.socket:
    """A scheduler's Gloo device listener."""
    name = os.environ.get("GLOO_SOCKET_IFNAME", "").split(",")[0]
    address = interface_address(name) if name else socket.gethostbyname(socket.gethostname())
    return socket.create_server((address, 0))
