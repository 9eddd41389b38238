"""specfleet status: one table for the fleet, read-only, one round trip a host.

    pyinfra inventory/ct200.py status.py                 # each host, class, deployment, unit, state, weights,
                                                         # SGLang, endpoint, gateway membership, accept length
    pyinfra inventory/ct200.py status.py --data json=true   # the same records as one JSON list on stdout

A unit's gateway column is its place in every gateway of the inventory that routes its model: ready,
failed (the gateway's word for it), absent, or unknown when the gateway's host was not read. A host
whose data the deploy would refuse, or that was not reached, says so in its row; the run then exits 1.
Nothing changes on any host: the table ends the run before pyinfra's change detection.
"""

from pyinfra import host, inventory

from deployment import knobs
from operations import status
from operations.basics import deploy_files

deploy_files.named_for_inspect(__file__)  # pyinfra's operation order, without a scan of every module per call

try:
    as_json = knobs.boolean("json", host.data.get("json", False))
except knobs.BadHostData as problem:
    raise SystemExit(f"status.py: {problem}") from None
view = status.view_of(host, inventory)
status.report(host, view, None if view.problem else status.observed(view), as_json)
