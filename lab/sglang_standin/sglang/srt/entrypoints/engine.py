"""LAB STAND-IN for how SGLang 0.5.23 starts its processes (srt/entrypoints/engine.py).

Spawned like the real ones (`mp.set_start_method("spawn")`, engine.py:1995): one scheduler
process per local TP rank (engine.py:931-961) and, on node rank 0, one detokenizer process
(engine.py:1060-1068). No data-parallel controller: the lab's profiles run one DP rank.

Each scheduler holds its GPU: SPECFLEET_LAB_GPU=<nvidia-smi index> in its environment, which the
nvidia-smi stand-in lists under --query-compute-apps as the real tool lists a scheduler's process.
A rank given no GPU (CUDA shows none at its gpu_id) fails as the real set_device does.
"""

import contextlib
import multiprocessing
import os
from multiprocessing import resource_tracker
from dataclasses import dataclass
from multiprocessing.connection import Connection

from sglang.srt.managers.detokenizer_manager import run_detokenizer_process
from sglang.srt.managers.scheduler import run_peer_rank, run_scheduler_process

# The real server runs one scheduler per local GPU; the stand-in starts as many processes up to
# this cap (the lab's 2-core controller runs several servers at once).
LOCAL_RANKS_CAP = 8


@dataclass
class Subprocesses:
    schedulers: list  # multiprocessing.Process, rank 0 first
    detokenizer: object | None
    to_scheduler: Connection | None  # node rank 0: to the rank-0 scheduler
    receivers: list[Connection]  # node rank 0: from the detokenizer and the rank-0 scheduler
    peer_links: list[Connection]  # node rank >= 1: one per local scheduler

    @property
    def processes(self) -> tuple[list, list[str]]:
        """The SubprocessWatchdog's list and names (engine.py:1313-1316)."""
        processes = [*self.schedulers, *([self.detokenizer] if self.detokenizer else [])]
        return processes, [p.name for p in processes]


def local_ranks(tp_size: int, nnodes: int) -> tuple[int, int]:
    """(first TP rank of this node's share, scheduler processes to start)."""
    per_node = max(1, tp_size // max(1, nnodes))
    return per_node, min(LOCAL_RANKS_CAP, per_node)


@contextlib.contextmanager
def on_gpu(gpu: int | None):
    """Start a child on `gpu`: a spawned process takes the environment of the moment it starts."""
    before = os.environ.get("SPECFLEET_LAB_GPU")
    if gpu is None:
        os.environ.pop("SPECFLEET_LAB_GPU", None)
    else:
        os.environ["SPECFLEET_LAB_GPU"] = str(gpu)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("SPECFLEET_LAB_GPU", None)
        else:
            os.environ["SPECFLEET_LAB_GPU"] = before


def launch(tp_size: int, nnodes: int, node_rank: int, config: dict, gpus: list | None = None) -> Subprocesses:
    """Start this node's ranks, rank i on `gpus[i]` (nvidia-smi indices; None: CUDA shows no GPU there)."""
    context = multiprocessing.get_context("spawn")
    per_node, count = local_ranks(tp_size, nnodes)
    gpus = list(gpus or []) + [None] * count
    with on_gpu(None):  # the first spawn starts multiprocessing's resource tracker: it holds no GPU
        resource_tracker.ensure_running()

    def start(process, local_rank: int) -> None:
        with on_gpu(gpus[local_rank]):
            process.start()

    if node_rank > 0:
        pairs = [context.Pipe() for _ in range(count)]
        schedulers = [context.Process(target=run_peer_rank, args=(node_rank * per_node + i, tp_size, theirs,
                                                                   gpus[i] is not None),
                                      name=f"scheduler_{i}") for i, (_, theirs) in enumerate(pairs)]
        for i, process in enumerate(schedulers):
            start(process, i)
        for mine, theirs in pairs:
            theirs.close()
            mine.recv()  # ready
        return Subprocesses(schedulers, None, None, [], [mine for mine, _ in pairs])

    peer_pairs = [context.Pipe() for _ in range(count - 1)]
    to_scheduler_r, to_scheduler_w = context.Pipe(duplex=False)
    from_scheduler_r, from_scheduler_w = context.Pipe(duplex=False)
    to_detokenizer_r, to_detokenizer_w = context.Pipe(duplex=False)
    from_detokenizer_r, from_detokenizer_w = context.Pipe(duplex=False)
    rank0 = context.Process(target=run_scheduler_process, name="scheduler_0",
                            args=(tp_size, config, to_scheduler_r, from_scheduler_w, to_detokenizer_w,
                                  [mine for mine, _ in peer_pairs], gpus[0] is not None))
    peers = [context.Process(target=run_peer_rank, args=(i, tp_size, theirs, gpus[i] is not None),
                             name=f"scheduler_{i}")
             for i, (_, theirs) in enumerate(peer_pairs, 1)]
    detokenizer = context.Process(target=run_detokenizer_process, name="detokenizer",
                                  args=(to_detokenizer_r, from_detokenizer_w))
    for i, process in enumerate((rank0, *peers)):
        start(process, i)
    with on_gpu(None):
        detokenizer.start()
    # Only the children hold their ends: a child that dies closes them.
    for end in (to_scheduler_r, from_scheduler_w, to_detokenizer_r, to_detokenizer_w, from_detokenizer_w,
                *(end for pair in peer_pairs for end in pair)):
        end.close()
    return Subprocesses([rank0, *peers], detokenizer, to_scheduler_w, [from_detokenizer_r, from_scheduler_r], [])
