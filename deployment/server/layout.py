"""How a deployment's model is served on a host: the tensor-parallel size of one SGLang server, how
many such servers (replicas) run, and which GPUs each one gets; checked as a whole.

The pair of class and profile decides it (group_data/<class>.py `layouts[profile]`), and a host's
`deployments` entry may narrow it (its own `gpus`, `tp_size`, `replicas`, `port`, `context_length`). Each replica is a
unit of its own (operations/server/unit.py), named after its deployment and its GPUs, so that two
units of one name always hold the same GPUs, and units of different names never share one: a unit
whose name is not wanted any more is stopped before a unit that might take its GPUs starts.
"""

from dataclasses import dataclass
from typing import Any

from deployment import knobs
from deployment.knobs import BadHostData

KEYS = ("tp_size", "replicas", "gpus", "context_length")  # what a layout may say
# Where SGLang 0.5.23 draws a server's --nccl-port when none is given (srt/utils/network.py,
# get_free_port_below_ephemeral: bound to test, released, bound again by the scheduler later), so
# another server may take any of them; the dist-init port (node_groups, 25000) and smg's Prometheus
# port (group_data/gateway.py, 29000) lie here too. The kernel's ephemeral range starts at 32768 by
# default (ip_local_port_range): a connection's local port could take one there first.
SGLANG_RANDOM_PORTS = range(22000, 30000)
EPHEMERAL_START = 32768
DEPLOYMENT_KEYS = ("profile", "name", "port", *KEYS)  # what a host's `deployments` entry may say


@dataclass(frozen=True)
class Layout:
    """One deployment's servers on a host: each replica's GPUs (nvidia-smi indices), HTTP port and
    --nccl-port (its TCPStore)."""

    tp_size: int  # per replica, on this host (a node group's is over all its nodes)
    groups: tuple[tuple[int, ...], ...]  # per replica, its GPUs, in CUDA_VISIBLE_DEVICES order
    ports: tuple[int, ...]  # per replica
    nccl_ports: tuple[int, ...]  # per replica
    # The longest request its replicas serve (--context-length), where a replica's KV cache holds less than
    # one full context of the model on these GPUs; None: the model's own (its max_position_embeddings).
    context_length: int | None = None

    @property
    def gpus(self) -> tuple[int, ...]:
        return tuple(gpu for group in self.groups for gpu in group)


def gpu_ranges(gpus: tuple[int, ...]) -> str:
    """GPUs as a unit-name word: runs of consecutive indices `a-b`, joined by `_` (0-7, 4, 0_2, 0-1_4-5)."""
    runs: list[list[int]] = []
    for gpu in gpus:
        if runs and gpu == runs[-1][-1] + 1:
            runs[-1].append(gpu)
        else:
            runs.append([gpu])
    return "_".join(str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}" for run in runs)


def unit_name(prefix: str, deployment: str, gpus: tuple[int, ...]) -> str:
    """A replica's unit: `PREFIX@DEPLOYMENT-gpuRANGES`, e.g. sglang@qwen36_ddtree-gpu3 (one file per replica,
    named like a template's instance, so `systemctl status 'sglang@*'` lists them)."""
    return f"{prefix}@{deployment}-gpu{gpu_ranges(gpus)}"


def _gpu_list(name: str, value: Any, count: int) -> tuple[int, ...]:
    if not isinstance(value, (list, tuple)) or not value:
        raise knobs.refused(name, value, "use a list of GPU indices, e.g. [0, 1, 2, 3]")
    gpus = tuple(knobs.integer(name, gpu, minimum=0, maximum=count - 1) for gpu in value)
    if len(set(gpus)) != len(gpus):
        raise knobs.refused(name, value, "name each GPU once")
    return gpus


def nccl_ports(groups: tuple[tuple[int, ...], ...], nccl_port: int) -> tuple[int, ...]:
    """Each replica's --nccl-port: `nccl_port` + the index of its lowest GPU, so replicas on disjoint GPUs
    (every deployment of a host) never share one; checked to lie outside SGLang's random range and below
    the kernel's ephemeral range (BadHostData naming the knob otherwise)."""
    ports = tuple(nccl_port + min(group) for group in groups)
    clash = next((p for p in ports if p in SGLANG_RANDOM_PORTS or p >= EPHEMERAL_START), None)
    if clash is not None:
        low, high = SGLANG_RANDOM_PORTS.stop, EPHEMERAL_START - 1 - max(map(min, groups))
        raise knobs.refused("nccl_port", nccl_port, f"use a nccl_port from {low} to {high}",
                            wrong=f"gives a replica --nccl-port {clash}, inside SGLang's random ports "
                                  f"{SGLANG_RANDOM_PORTS.start}-{SGLANG_RANDOM_PORTS.stop - 1} (another server may "
                                  f"draw it) or the kernel's ephemeral ones ({EPHEMERAL_START} and up)")
    return ports


def resolve(where: str, values: Any, gpu_count: int, host_port: int, nccl_port: int,
            port: int | None = None) -> Layout:
    """The layout `values` says (a dict of KEYS) on a host of `gpu_count` GPUs. Each replica listens on
    `host_port` + the index of its lowest GPU, so replicas on disjoint GPUs never share a port; `port`
    (a deployment's own) moves them together, the replica on its lowest GPU there. Its TCPStore takes
    `nccl_port` + that index (nccl_ports). A bad value raises BadHostData naming the knob (`where`), the
    value and what is accepted."""
    if not isinstance(values, dict) or set(values) - set(KEYS) or "tp_size" not in values:
        raise knobs.refused(where, values, "use dict(tp_size=N) with optionally replicas=N, gpus=[...] (the GPUs "
                            "its replicas take, tp_size at a time) and context_length=N (the longest request)")
    tp_size = knobs.integer(f"{where}['tp_size']", values["tp_size"], minimum=1, maximum=gpu_count)
    pool = _gpu_list(f"{where}['gpus']", values["gpus"], gpu_count) if values.get("gpus") is not None \
        else tuple(range(gpu_count))
    if tp_size > len(pool):
        raise BadHostData(f"{where}: tp_size {tp_size} needs {tp_size} GPUs, it has {len(pool)}: give it more "
                          "GPUs or a smaller tp_size")
    fits = len(pool) // tp_size
    if values.get("replicas") is None:
        if len(pool) % tp_size:
            raise BadHostData(f"{where}: {len(pool)} GPUs do not make replicas of tp_size {tp_size}: use GPUs a "
                              f"multiple of {tp_size}, or say how many replicas (at most {fits})")
        replicas = fits
    else:
        replicas = knobs.integer(f"{where}['replicas']", values["replicas"], minimum=1)
        if replicas > fits:
            raise knobs.refused(f"{where}['replicas']", replicas, f"use at most {fits}, or give it more GPUs",
                                wrong=f"does not fit {len(pool)} GPUs at tp_size {tp_size}")
    groups = tuple(pool[i * tp_size:(i + 1) * tp_size] for i in range(replicas))
    lowest = min(pool)
    first = host_port + lowest if port is None else port
    ports = tuple(first + min(group) - lowest for group in groups)
    if max(ports) > 65535:
        raise BadHostData(f"{where}: its replicas would listen up to port {max(ports)}: use a lower port")
    context_length = knobs.integer(f"{where}['context_length']", values["context_length"], minimum=1) \
        if values.get("context_length") is not None else None
    return Layout(tp_size=tp_size, groups=groups, ports=ports, nccl_ports=nccl_ports(groups, nccl_port),
                  context_length=context_length)


def class_default(data: Any, host_class: str, profile: str, gpu_count: int) -> dict:
    """The class's layout of `profile` (group_data/<class>.py `layouts`); a profile it does not name is
    served as one server over all of the class's GPUs (the one layout every model that fits the class fits)."""
    layouts = getattr(data, "layouts", None)
    if layouts is None:
        layouts = {}
    if not isinstance(layouts, dict):
        raise knobs.refused("layouts", layouts, f"use a dict of profile -> dict(tp_size=N, ...) in "
                            f"group_data/{host_class}.py")
    return dict(layouts.get(profile) or {"tp_size": gpu_count})
