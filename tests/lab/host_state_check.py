"""A pyinfra deploy file for tests/lab/test_host_state.py: on each host, every fact the deploy reads,
once from the one-round-trip host program and once by its own command; writes both to
`--data host_state_out=DIR`/HOST.json."""

import json
from pathlib import Path

from pyinfra import host

from deployment.hosts import at_commits, host_class_of, resolve  # noqa: F401
from operations.basics import gathering
# Every module whose operations register the facts they read, as deploy.py imports them.
from operations.gpu import nvidia, smoke  # noqa: F401
from operations.run import preflight  # noqa: F401
from operations.server import readiness, stages, unit  # noqa: F401
from operations.weights import download, revisions, hf_token  # noqa: F401
from operations.weights.checks import WeightsDisk, hub_state
from operations.weights.download import WeightsState, state_listings

deployment = resolve(host.data, host_class_of(host.groups))
wanted = gathering.requests(deployment)
gathered = gathering.answered(wanted)
rows = [{"fact": fact.__name__, "arguments": sorted(kwargs), "answered": gathering.key(fact, kwargs) in gathered,
         "gathered": gathered.get(gathering.key(fact, kwargs)), "own_command": gathering.own_command(fact, **kwargs)}
        for fact, kwargs in wanted]
# The facts the operations read from another one's answer (`answered_by`), at the hub's commits, as derived
# on the controller and as their own commands answer.
hub = hub_state(deployment.weights)
repos = at_commits(deployment, hub.commits).weights.repos
for fact, kwargs in [(WeightsState, dict(listings=state_listings(repos, hub.snapshots))),
                     (WeightsDisk, dict(local_dirs=tuple(r.local_dir for r in repos)))]:
    value = gathering.derived(fact, gathered, kwargs)
    rows.append({"fact": fact.__name__, "arguments": sorted(kwargs), "answered": value is not None,
                 "gathered": value, "own_command": gathering.own_command(fact, **kwargs)})
Path(host.data.host_state_out, f"{host.name}.json").write_text(json.dumps(rows, indent=1, default=str))
