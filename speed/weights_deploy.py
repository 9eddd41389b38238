"""The deploy's weights stage alone (P2, P3): resolve, the hub snapshot on the controller, the stage.

deploy.py's stage 5 itself (operations.weights.stages.weights_fetched: the repo directories the
download user owns, then the download into them); point the target at a bench repo with
--group-data (tests.helpers.write_group_data).
"""

from pyinfra import host, inventory

from deployment.gateway import membership
from deployment.hosts import host_class_of, resolve
from operations.weights.checks import hub_state
from operations.weights.stages import weights_fetched

weights = resolve(host.data, host_class_of(host.groups)).weights
hub = hub_state(weights)
if not hub.complete:
    raise SystemExit(f"hub problems: {hub.problems + hub.pending}")
weights_fetched((weights,), [hub], membership.of(inventory).workers)
