"""Each replica's KV-cache plan, kept on its host beside its unit's environment file, for what checks the
running engine against it (tests/deployed) and for the run's summary.

The plan is written where the replica runs, not recomputed by its checks: what preflight planned from
the hub's files and the GPUs it read is what the engine is held to, and a check run later against a real
fleet needs neither the hub nor the deploy's data.
"""

import json
import shlex
from io import StringIO

from pyinfra import host
from pyinfra.api import operation

from deployment.gpu.config import GpuExpectations
from deployment.server import capacity
from deployment.server.config import Server
from operations.basics import gathering, outcomes, shell
from operations.basics.file_states import FileStates, matches
from operations.gpu.facts import NvidiaGpus, unreadable
from operations.server.checks import kv_plan
from operations.server.unit import kv_plan_file

MODE = "644"  # figures, no secret: an operator reads them as any user


def path(server: Server) -> str:
    """Where `server`'s plan is kept: root's, beside its unit's environment file (removed with the unit)."""
    return kv_plan_file(server.engine.service.config_dir, server.service_name)


def text(plan: capacity.CapacityPlan) -> str:
    """The plan file's content: the tokens planned, the pool a GPU and the bytes a token behind them."""
    return json.dumps({"replica": plan.replica, "planned_tokens": plan.tokens, "pool_bytes": plan.pool_bytes,
                       "bytes_per_token": plan.bytes_per_token}, indent=1) + "\n"


def planned_tokens(content: str) -> int:
    """The tokens a plan file's content says (`text`)."""
    return int(json.loads(content)["planned_tokens"])


@operation()
def kept(server: Server, expected: GpuExpectations, snapshots: dict):
    """
    Keep the replica's KV plan (``checks.kv_plan``) in its plan file, written only when it changes; a model
    the planner has no rule for has none (a file from before is removed: its engine is not that plan's).
    Runs once the replica serves, so that a restart rolled back keeps the plan of the unit it restores.

    + server: the replica
    + expected: its class's GPUs (the memory where the host's could not be read)
    + snapshots: what the hub said of its repos, per role (``weights.checks.hub_state``)

    **Example:**

    .. code:: python

        capacity_record.kept(name="KV plan of sglang@x", server=replica, expected=worker.gpu.expected,
                             snapshots=hub.snapshots)
    """
    gpus = gathering.read(NvidiaGpus)
    file = path(server)
    kept_now = gathering.read(FileStates, paths=(file,)).get(file)
    try:
        plan = kv_plan(server, expected, snapshots, None if unreadable(gpus) else gpus)
    except capacity.NoRule:
        if kept_now:
            yield f"rm -f -- {shlex.quote(file)}"
        else:
            host.noop(f"{server.service_name}: no KV plan (preflight said why)")
        return
    outcomes.note_replica(host, "kv_planned", server.service_name, plan.tokens)
    wanted = text(plan)
    if matches(kept_now, "file", MODE, "root", wanted.encode()):
        host.noop(f"{file} holds the plan: {plan.tokens:,} tokens")
        return
    yield from shell.put(src=StringIO(wanted), dest=file, user="root", group="root", mode=MODE)


@gathering.wants
def _read(deployment) -> gathering.Wanted:
    return [(FileStates, dict(paths=(path(r),))) for r in deployment.replicas]
