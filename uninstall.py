"""specfleet uninstall: remove what deploy.py laid down on the selected hosts, keeping the weights unless asked.

    pyinfra inventory/ct200.py uninstall.py                              # shows what goes, asks first
    pyinfra -y inventory/ct200.py uninstall.py --limit ct200             # no question
    pyinfra inventory/ct200.py uninstall.py --data remove_weights=true   # the weights too

Each replica leaves the gateways that list it (its requests in flight finish) and its unit stops and goes;
then the weights download units and the gateway's, Prometheus's targets (Debian's package stays, stopped),
the service users with their homes (the HF token is in one), the install and configuration directories
(virtualenvs, host programs, API and admin keys, unit environment files). The GPU driver and its services
stay. A deploy afterwards converges from scratch (it fetches only the weights it no longer finds).
"""

from pyinfra import host, inventory

from operations import status, uninstall
from operations.basics import deploy_files, knobs
from operations.deployment import preflight
from operations.gateway import drain, membership
from operations.server import unit

deploy_files.named_for_inspect(__file__)  # pyinfra's operation order, without a scan of every module per call

try:
    view = status.view_of(host, inventory)
    if view.problem:
        raise knobs.BadHostData(view.problem)
    remove_weights = knobs.boolean("remove_weights", host.data.get("remove_weights", False))
    plan = uninstall.plan(view.service, view.gateway, knobs.path("weights_dir", host.data.weights_dir), remove_weights,
                          view.replicas)
except knobs.BadHostData as problem:
    preflight.refuse(name="Uninstall", problem=f"{host.name}: {problem}")
else:
    if view.service:
        # No replica wanted: every SGLang unit of the host is retired, as the deploy retires one.
        replacement = unit.Replacement(view.service, [])
        drain.drain_retired(name="SGLang units leave the gateways", replacement=replacement,
                            gateways=membership.gateways(membership.of(inventory), host))
        unit.retired(name="SGLang units", replacement=replacement)
        unit.removed(name="SGLang units removed", replacement=replacement)
    uninstall.removed(name="What the deploy laid down", uninstall=plan)
