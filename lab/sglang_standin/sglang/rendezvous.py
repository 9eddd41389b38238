"""LAB STAND-IN for SGLang's multi-node start (`--nnodes N --node-rank R --dist-init-addr HOST:PORT`).

What the real 0.5.23 does, as far as a deploy can see it: every node's schedulers join
torch.distributed's TCP store on node 0's dist-init port and stay connected while they run;
node 0 serves HTTP only once every rank has joined (its schedulers' init blocks until then),
nodes of rank >= 1 serve no model, only a dummy health server (launch_server.py), a node waits for the
others until the distributed timeout, and a node that dies takes the group down (the next
collective fails with "Connection closed by peer" and the scheduler exits the server). NCCL
refuses an NCCL_SOCKET_IFNAME that names no interface of the node.

Here the store is one TCP connection per rank with a one-line handshake; rank 0's ShutdownReq
broadcast (a graceful stop) is the only thing sent on it afterwards.
"""

import os
import socket
import sys
import threading
import time
from pathlib import Path

JOIN = "specfleet-standin-join"
TIMEOUT_S = 1800  # torch.distributed's default (SGLang's --dist-timeout unset)
SHUTDOWN = b"shutdown\n"
_leaving = threading.Event()  # this node is stopping the group: links closing are expected


def _die(message: str) -> None:
    print(f"[lab stand-in] {message}", file=sys.stderr, flush=True)
    os._exit(1)


def check_interfaces() -> None:
    """NCCL's bootstrap finds no interface when NCCL_SOCKET_IFNAME's prefixes match none (Gloo: exact names)."""
    present = [p.name for p in Path("/sys/class/net").iterdir()]
    for variable, exact in (("NCCL_SOCKET_IFNAME", False), ("GLOO_SOCKET_IFNAME", True)):
        wanted = [name for name in os.environ.get(variable, "").lstrip("=^").split(",") if name]
        if wanted and not any(name == p or (not exact and p.startswith(name)) for name in wanted for p in present):
            _die(f"NCCL WARN Bootstrap : no socket interface found ({variable}={os.environ[variable]}; "
                 f"this node has {', '.join(sorted(present))})")


def _address(dist_init_addr: str) -> tuple[str, int]:
    host, _, port = dist_init_addr.rpartition(":")
    return host.strip("[]"), int(port)


def join(args) -> socket.socket:
    """Rank >= 1: connect to rank 0's store (retrying until the timeout), announce this rank."""
    address = _address(args.dist_init_addr)
    deadline = time.monotonic() + (args.dist_timeout or TIMEOUT_S)
    print(f"Init torch distributed begin. node_rank={args.node_rank}, connecting to {args.dist_init_addr}",
          flush=True)
    while True:
        try:
            link = socket.create_connection(address, timeout=5)
            link.sendall(f"{JOIN} {args.node_rank} {args.nnodes}\n".encode())
            answer = link.makefile().readline().strip()
            if answer == "ok":
                link.settimeout(None)
                print(f"Init torch distributed ends. node_rank={args.node_rank} joined {args.dist_init_addr}",
                      flush=True)
                return link
            link.close()
            _die(f"torch.distributed.DistStoreError: rank 0 at {args.dist_init_addr} refused node rank "
                 f"{args.node_rank}: {answer or 'connection closed'}")
        except OSError as error:
            if time.monotonic() > deadline:
                _die(f"torch.distributed.DistNetworkError: failed to connect to {args.dist_init_addr} "
                     f"within {args.dist_timeout or TIMEOUT_S}s: {error}")
            time.sleep(1)


def gather(args) -> dict[int, socket.socket]:
    """Rank 0: hold the store on the dist-init port until ranks 1..nnodes-1 have joined."""
    _, port = _address(args.dist_init_addr)
    store = socket.create_server(("", port), family=socket.AF_INET, reuse_port=False)
    joined: dict[int, socket.socket] = {}
    everyone = threading.Event()
    lock = threading.Lock()

    def welcome(link: socket.socket) -> None:
        try:
            link.settimeout(10)
            words = link.makefile().readline().split()
            rank = int(words[1]) if len(words) == 3 and words[0] == JOIN else -1
            with lock:
                if words[2:] != [str(args.nnodes)] or not 0 < rank < args.nnodes or rank in joined:
                    link.close()  # not a rank of this group (a port probe, a stale rank)
                    return
                link.sendall(b"ok\n")
                link.settimeout(None)
                joined[rank] = link
                print(f"Init torch distributed: node rank {rank} joined from {link.getpeername()[0]} "
                      f"({len(joined) + 1}/{args.nnodes})", flush=True)
                if len(joined) == args.nnodes - 1:
                    everyone.set()
        except (OSError, ValueError, IndexError):
            link.close()

    def accept() -> None:
        while True:
            link, _ = store.accept()
            threading.Thread(target=welcome, args=(link,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    print(f"Init torch distributed begin. node_rank=0, waiting for {args.nnodes - 1} node rank(s) on "
          f"{args.dist_init_addr}", flush=True)
    if not everyone.wait(args.dist_timeout or TIMEOUT_S):
        missing = sorted(set(range(1, args.nnodes)) - set(joined))
        _die(f"torch.distributed.DistStoreError: timed out waiting for node rank(s) {missing}")
    print(f"Init torch distributed ends. all {args.nnodes} nodes joined", flush=True)
    return joined


def watch(links: dict[int, socket.socket], on_shutdown=None) -> None:
    """Every rank's link stays open while it runs: a peer that goes away takes this node down,
    unless rank 0 is stopping the group (broadcast_shutdown), which `on_shutdown` then handles."""
    def follow(rank: int, link: socket.socket) -> None:
        received = b""
        try:
            while chunk := link.recv(1024):
                received += chunk
                if SHUTDOWN in received and on_shutdown is not None:
                    on_shutdown()
                    return
        except OSError:
            pass
        if not _leaving.is_set():
            _die(f"RuntimeError: [gloo/transport/tcp/pair.cc] Connection closed by peer (node rank {rank}): "
                 "the group lost a node; exiting")

    for rank, link in links.items():
        threading.Thread(target=follow, args=(rank, link), daemon=True).start()


def broadcast_shutdown(links: dict[int, socket.socket]) -> None:
    """Rank 0's ShutdownReq reaches the schedulers of every node (engine.py:1262-1273: the other
    ranks wait for it)."""
    _leaving.set()
    for link in links.values():
        try:
            link.sendall(SHUTDOWN)
        except OSError:
            pass
