"""A pyinfra deploy file for tests/lab/test_host_state.py: on each host, every fact the deploy reads,
once from the one-round-trip host program and once by its own command; writes both to
`--data host_state_out=DIR`/HOST.json."""

import json
from pathlib import Path

from pyinfra import host

from operations.basics import gathering
from operations.deployment import host_class_of, preflight, resolve  # noqa: F401
# Every module whose operations register the facts they read, as deploy.py imports them.
from operations.gpu import nvidia, smoke  # noqa: F401
from operations.server import readiness, stages, unit  # noqa: F401
from operations.weights import download, revisions, token  # noqa: F401
from operations.weights.checks import hub_state

deployment = resolve(host.data, host_class_of(host.groups))
snapshots = hub_state(deployment.weights).snapshots
wanted = gathering.requests(deployment, snapshots)
gathered = gathering.answered(wanted)
rows = [{"fact": fact.__name__, "arguments": sorted(kwargs), "answered": gathering.key(fact, kwargs) in gathered,
         "gathered": gathered.get(gathering.key(fact, kwargs)), "own_command": gathering.own_command(fact, **kwargs)}
        for fact, kwargs in wanted]
Path(host.data.host_state_out, f"{host.name}.json").write_text(json.dumps(rows, indent=1, default=str))
