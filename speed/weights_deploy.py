"""The deploy's weights stage alone (P2, P3): resolve, the hub snapshot on the controller, download.download.

The same operation with the same arguments as deploy.py's stage 5; point the target at
a bench repo with --group-data (tests.helpers.write_group_data).
"""

from pyinfra import host

from operations.deployment import host_class_of, resolve
from operations.weights import download
from operations.weights.checks import hub_state

weights = resolve(host.data, host_class_of(host.groups)).weights
hub = hub_state(weights)
if not hub.complete:
    raise SystemExit(f"hub problems: {hub.problems + hub.pending}")
download.download(name="Weights", weights=weights, snapshots=hub.snapshots)
