"""A pyinfra deploy file for tests/lab/test_host_state.py: on each host, every fact the deploy reads,
once from the one-round-trip host program and once by its own command; writes both to
`--data host_state_out=DIR`/HOST.json."""

import json
from pathlib import Path

from pyinfra import host

from operations.basics import gathering
from operations.deployment.config import host_class_of, resolve
from operations.deployment.preflight import hub_snapshots

deployment = resolve(host.data, host_class_of(host.groups))
snapshots, _, _ = hub_snapshots(deployment)
wanted = gathering.requests(deployment, snapshots)
gathered = gathering.answered(wanted)
rows = [{"fact": fact.__name__, "arguments": sorted(kwargs), "answered": gathering._key(fact, kwargs) in gathered,
         "gathered": gathered.get(gathering._key(fact, kwargs)), "own_command": host.get_fact(fact, **kwargs)}
        for fact, kwargs in wanted]
Path(host.data.host_state_out, f"{host.name}.json").write_text(json.dumps(rows, indent=1, default=str))
