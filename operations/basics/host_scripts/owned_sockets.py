"""Runs ON THE HOST (system python3, stdlib only), imported by the host programs that send a key to a
server on the same host: a connection that goes on only when the server's end of it belongs to the
user expected to serve there. While that server is down, any local user may bind its port, and must
not receive the key.
"""

import http.client
import socket
from pathlib import Path

LOOPBACK = "127.0.0.1"  # network.LOOPBACK on the hosts, which lack the product (a test keeps them equal)
TCP_TABLES = ("/proc/net/tcp", "/proc/net/tcp6")
# The states (include/net/tcp_states.h) of a socket some process holds. A closed connection's TIME_WAIT
# entry lingers under uid 0 for a minute, and where its ports are those of a new connection (a busy
# gateway's clients), it would read as the new one's owner.
HELD = {"01", "0A"}  # ESTABLISHED, LISTEN


def socket_owners(tables=TCP_TABLES) -> dict[tuple[int, int], int]:
    """(local port, remote port) -> uid of every TCP socket a process of the host holds (/proc/net/tcp*)."""
    owners = {}
    for table in tables:
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if fields[3] not in HELD:
                continue
            local_port = int(fields[1].rsplit(":", 1)[1], 16)
            remote_port = int(fields[2].rsplit(":", 1)[1], 16)
            owners[(local_port, remote_port)] = int(fields[7])
    return owners


class OwnedConnection(http.client.HTTPConnection):
    """An HTTP connection to a server on this host that refuses to go on unless the server's end is
    `uid`'s (`whose` names that user in the refusal)."""

    def __init__(self, address: str, port: int, uid: int, timeout: float, whose: str):
        super().__init__(address, port, timeout=timeout)
        self.uid, self.whose = uid, whose
        self._create_connection = self._connected_socket

    @staticmethod
    def _connected_socket(address: tuple[str, int], *rest) -> socket.socket:
        """socket.create_connection, an ASCII host given as bytes: getaddrinfo encodes a str with the idna
        codec, whose import (stringprep, unicodedata) is 9 ms of a lab host's no-op probe, the longest
        part of its host program."""
        host, port = address
        return socket.create_connection((host.encode() if host.isascii() else host, port), *rest)

    def connect(self):
        super().connect()
        ours = self.sock.getsockname()[1]
        # The server's end of this very connection: (its port, our port), owned by whoever listened.
        owner = socket_owners().get((self.port, ours))
        if owner != self.uid:
            self.sock.close()
            raise PermissionError(f"port {self.port} is served by uid {owner}, not {self.whose}'s uid "
                                  f"{self.uid}: the API key was not sent")
