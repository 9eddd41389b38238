"""Runs ON THE HOST (system python3, stdlib only): can the nodes of a group reach rank 0's dist-init port?

    node_reach.py hold ADDRESS PORT SECONDS PEER...   (rank 0) listen on ADDRESS:PORT until every
                                                      PEER connected, or SECONDS passed
    node_reach.py reach ADDRESS PORT SECONDS          (rank >= 1) connect to ADDRESS:PORT, retrying

Both run at the same time on their nodes, before SGLang is started. Each prints one JSON line.
`hold` finding the port taken (the group's server already holds it) leaves it to the server.
"""

import errno
import json
import socket
import sys
import time


def hold(address: str, port: int, seconds: float, peers: list[str]) -> dict:
    try:
        server = socket.create_server((address, port))
    except OSError as error:
        if error.errno == errno.EADDRINUSE:
            return {"ok": True, "held_by": "another process (the running server)"}
        if error.errno == errno.EADDRNOTAVAIL:
            return {"ok": False, "error": f"{address} is not an address of this host"}
        return {"ok": False, "error": f"cannot listen on {address}:{port}: {error.strerror}"}
    seen: set[str] = set()
    deadline = time.monotonic() + seconds
    with server:
        while not set(peers) <= seen and time.monotonic() < deadline:
            server.settimeout(max(0.1, deadline - time.monotonic()))
            try:
                link, (peer, _) = server.accept()
            except socket.timeout:
                break
            link.close()
            seen.add(peer.removeprefix("::ffff:"))
    return {"ok": True, "seen": sorted(seen)}


def reach(address: str, port: int, seconds: float) -> dict:
    """Retried while rank 0 may not listen yet (refused) or answers late; no route to it fails at once."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            socket.create_connection((address, port), timeout=3).close()
            return {"ok": True}
        except socket.timeout:
            why = "no answer (timed out): packets to it are dropped, or the address is wrong"
        except ConnectionRefusedError:
            why = "connection refused: nothing listened there, or a firewall rejects it"
        except OSError as error:
            return {"ok": False, "error": error.strerror or str(error)}
        if time.monotonic() >= deadline:
            return {"ok": False, "error": why}
        time.sleep(0.5)


if __name__ == "__main__":
    mode, address, port, seconds, *peers = sys.argv[1:]
    result = hold(address, int(port), float(seconds), peers) if mode == "hold" else \
        reach(address, int(port), float(seconds))
    print(json.dumps(result))
    sys.exit(0 if result["ok"] else 1)
