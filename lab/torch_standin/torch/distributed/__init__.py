# LAB STAND-IN, NOT PyTorch's torch.distributed + NCCL (see torch/__init__.py).
"""torch.distributed with the "nccl" backend as the smoke test uses it.

The ranks meet over TCP on the init_method's port (rank 0 listens, as torch's TCPStore does). As with
NCCL, a collective is queued on the GPU's stream and all_reduce returns at once: the tensor holds its
result once read (`.item()`, a comparison), and torch.cuda.synchronize() waits until the stream has
spent the time NCCL would take on the host's GPUs (torch/_gpus.py) on everything queued. A rank sends its
queued contributions when it synchronizes or reads a result: a launch costs a real rank microseconds, and
sent at each call they put eight processes' socket and GIL traffic inside the smoke test's timed loop
(twenty 3 ms collectives on the B200 profile), which a loaded 2-core controller read as a slower NCCL. Rank 0
reduces each collective once every rank's contribution arrived and sends the result back. With
NCCL_DEBUG=INFO each rank prints its ring hop's transport as NCCL does ("via P2P/CUMEM" or
"via SHM/direct/direct"). A ring whose P2P hangs never completes its first collective.
"""

import json
import os
import socket
import sys
import threading
import time

import torch
from torch import _gpus


class ReduceOp:
    SUM, MAX, MIN = "sum", "max", "min"


_REDUCE = {"sum": sum, "max": max, "min": min}
_state: dict = {}


def is_initialized() -> bool:
    return bool(_state)


def get_rank() -> int:
    return _state["rank"]


def get_world_size() -> int:
    return _state["world_size"]


def _messages(sock):
    buffer = b""
    while True:
        while b"\n" not in buffer:
            chunk = sock.recv(65536)
            if not chunk:
                return
            buffer += chunk
        line, buffer = buffer.split(b"\n", 1)
        yield json.loads(line)


def _send(conn, message: dict) -> None:
    conn.sendall(json.dumps(message).encode() + b"\n")


def init_process_group(backend: str = "nccl", init_method: str | None = None, rank: int = 0, world_size: int = 1,
                       timeout=None, device_id=None, **_):
    if backend != "nccl":
        raise ValueError(f"specfleet lab stand-in: only the nccl backend, not {backend!r}")
    torch.cuda._lazy_init()
    host, port = init_method.removeprefix("tcp://").rsplit(":", 1)
    deadline = time.monotonic() + (timeout.total_seconds() if timeout is not None else 1800)
    state = dict(rank=rank, world_size=world_size, seq=0, stream_end=0.0, results={}, contributions={}, outbox=[],
                 done=threading.Condition(), ring=_gpus.ring(world_size), peers=[])
    if rank == 0:
        if world_size > 1:
            server = socket.create_server((host, int(port)))
            server.settimeout(max(0.1, deadline - time.monotonic()))
            joined = {}
            while len(joined) < world_size - 1:
                conn, _ = server.accept()
                conn.settimeout(None)
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                messages = _messages(conn)
                joined[next(messages)["rank"]] = (conn, messages)
            server.close()
            state["peers"] = [joined[r][0] for r in sorted(joined)]
            for r in sorted(joined):
                threading.Thread(target=_gather, args=(state, r, joined[r][1]), daemon=True).start()
    else:
        while True:
            try:
                conn = socket.create_connection((host, int(port)), timeout=5)
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"The client socket has timed out while trying to connect to ({host}, {port})")
                time.sleep(0.05)
        conn.settimeout(None)
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        _send(conn, {"rank": rank})
        state["peers"] = [conn]
        threading.Thread(target=_receive, args=(state, _messages(conn)), daemon=True).start()
    if os.environ.get("NCCL_DEBUG", "").upper() in ("INFO", "TRACE"):
        via = "P2P/CUMEM" if state["ring"]["p2p"][rank] else "SHM/direct/direct"
        print(f"specfleet-lab:{os.getpid()} NCCL INFO Channel 00/0 : {rank}[{rank}] -> {(rank + 1) % world_size}"
              f"[{(rank + 1) % world_size}] via {via}", file=sys.stderr, flush=True)
        print(f"specfleet-lab:{os.getpid()} NCCL INFO comm rank {rank} nRanks {world_size} - Init COMPLETE",
              file=sys.stderr, flush=True)
    _state.clear()
    _state.update(state)


def _gather(state: dict, rank: int, messages) -> None:
    """Rank 0: one peer's contributions, in order; a collective complete on every rank is reduced."""
    for message in messages:
        _contribute(state, message["seq"], rank, message["payload"], message["op"])


def _contribute(state: dict, seq: int, rank: int, payload: dict, op: str) -> None:
    with state["done"]:
        contributions = state["contributions"].setdefault(seq, {})
        contributions[rank] = payload
        if len(contributions) < state["world_size"]:
            return
        del state["contributions"][seq]
        # A contribution naming an earlier collective's result: that one completed before (each rank queues in order).
        values = [state["results"][p["ref"]] if "ref" in p else p for p in contributions.values()]
        result = _reduced(values, op)
        state["results"][seq] = result
        state["done"].notify_all()
        # Under the lock: the threads of several peers complete collectives, one message at a time per socket.
        for conn in state["peers"]:
            _send(conn, {"seq": seq, "payload": result})


def _receive(state: dict, messages) -> None:
    """Ranks >= 1: the results rank 0 sends back."""
    for message in messages:
        with state["done"]:
            state["results"][message["seq"]] = message["payload"]
            state["done"].notify_all()


def _reduced(payloads: list, op: str) -> dict:
    combine = _REDUCE[op]
    if all("fill" in payload for payload in payloads):
        return {"fill": combine(payload["fill"] for payload in payloads)}
    columns = zip(*(payload.get("values") or [payload["fill"]] for payload in payloads))
    return {"values": [combine(column) for column in columns]}


def _queue(payload: dict, op: str, nbytes: int) -> int:
    state = _state
    if not state:
        raise ValueError("Default process group has not been initialized, please make sure to call "
                         "init_process_group.")
    state["seq"] += 1
    seq = state["seq"]
    now = time.monotonic()
    state["stream_end"] = max(state["stream_end"], now) + _gpus.seconds(state["ring"], nbytes, state["world_size"])
    state["outbox"].append({"seq": seq, "payload": payload, "op": op})
    return seq


def _flush() -> None:
    """The queued contributions, to rank 0 (rank 0's own, into the reduction)."""
    state = _state
    outbox, state["outbox"] = state["outbox"], []
    if state["rank"] == 0:
        for message in outbox:
            _contribute(state, message["seq"], 0, message["payload"], message["op"])
    elif outbox:
        state["peers"][0].sendall(b"".join(json.dumps(message).encode() + b"\n" for message in outbox))


def _wait(seq: int) -> dict:
    state = _state
    _flush()
    if state["ring"]["hangs"]:
        while True:  # NVIDIA/nccl#1999: the first collective never completes, and nothing says why
            time.sleep(3600)
    with state["done"]:
        state["done"].wait_for(lambda: seq in state["results"])
        return state["results"][seq]


def _result_into(tensor) -> None:
    """The tensor's queued collective, completed: its result in the tensor."""
    result = _wait(tensor.pending)
    tensor.pending = None
    if "values" in result:
        tensor.values = result["values"]
    else:
        tensor.fill, tensor.values = result["fill"], None


def synchronize() -> None:
    """torch.cuda.synchronize(): the stream has spent the time of every queued collective. Their results
    are waited for when a tensor is read, not here: the ranks' exchange runs on the host's CPUs, which a
    GPU's collective does not wait for, so a stall there is not NCCL's time (one make test on a new
    machine, building the lab's root filesystems beside it, read 140 GB/s for the profile's 313: 74 ms
    more over a timed loop of 60 ms, and the deploy's smoke test failed the B200 floor of 150)."""
    if _state:
        _flush()
        if _state["ring"]["hangs"]:
            _wait(_state["seq"])
        wait = _state["stream_end"] - time.monotonic()
        if wait > 0:
            time.sleep(wait)


def all_reduce(tensor, op=ReduceOp.SUM, group=None, async_op=False):
    # In place: a tensor still awaiting an earlier result contributes that result (named, not waited for).
    payload = ({"ref": tensor.pending} if tensor.pending is not None else
               {"values": tensor.values} if tensor.values is not None else {"fill": tensor.fill})
    tensor.pending = _queue(payload, op, tensor.nbytes)


def barrier(group=None, **_):
    _wait(_queue({"fill": 0}, ReduceOp.SUM, 0))
    synchronize()


def destroy_process_group(group=None):
    _wait(_state["seq"])  # every rank's contributions in before rank 0 closes its peers' sockets
    synchronize()
    for conn in _state.get("peers", []):
        conn.close()
    _state.clear()
