"""The deploy's weights stage alone (P2, P3): resolve, the hub snapshot on the controller, download.download.

The same operation with the same arguments as deploy.py's stage 5; point the target at
a bench repo with --group-data (tests.helpers.write_group_data).
"""

from pyinfra import host

from operations.deployment import preflight
from operations.weights import download
from operations.deployment.config import host_class_of, resolve

deployment = resolve(host.data, host_class_of(host.groups))
snapshots, hub_problems, access_pending = preflight.hub_snapshots(deployment)
if hub_problems or access_pending:
    raise SystemExit(f"hub problems: {hub_problems + access_pending}")
download.download(name="Weights", deployment=deployment, snapshots=snapshots, verify=deployment.verify_weights)
