"""specfleet uninstall: remove what deploy.py laid down on the selected hosts, keeping the weights unless asked.

    pyinfra inventory/ct200.py uninstall.py                              # shows what goes, asks first
    pyinfra -y inventory/ct200.py uninstall.py --limit ct200             # no question
    pyinfra inventory/ct200.py uninstall.py --data remove_weights=true   # the weights too

Each replica leaves the gateways that list it (its requests in flight finish) and its unit stops and goes;
then the weights download units and the gateway's, Prometheus's targets (Debian's package stays, stopped),
the fan-out's nginx, every account the deploy made with its home (the HF token is in one), the install
and configuration directories (virtualenvs, host programs, API and admin keys, unit environment files);
with remove_weights, the weights, deleted by their owner. Only what carries the deploy's mark goes (an
account's comment, a directory's .specfleet file): a host whose data names an account or a directory
that does not carry it, or an account the deploy would refuse, is refused in one line, nothing removed.
The GPU driver and its services stay. A deploy afterwards converges from scratch (it fetches only the
weights it no longer finds).
"""

from pyinfra import host, inventory

from deployment import knobs
from deployment.gateway import membership
from operations import status, uninstall
from operations.basics import deploy_files
from operations.gateway import drain
from operations.run import preflight
from operations.server import unit

deploy_files.named_for_inspect(__file__)  # pyinfra's operation order, without a scan of every module per call

try:
    view = status.view_of(host, inventory)
    if view.problem:
        raise knobs.BadHostData(view.problem)
    remove_weights = knobs.boolean("remove_weights", host.data.get("remove_weights", False))
    plan = uninstall.plan(view.service, view.gateway, knobs.path("weights_dir", host.data.weights_dir), remove_weights,
                          view.replicas)
    # Read before anything goes: a named account or directory that is not the deploy's refuses the host.
    left = host.get_fact(uninstall.Leftovers, **uninstall.asked(plan))
    refusal = uninstall.problem(plan, left)
    if refusal:
        raise knobs.BadHostData(refusal)
except knobs.BadHostData as problem:
    preflight.refuse(problem=f"{host.name}: {problem}")
else:
    if view.service:
        # No replica wanted: every SGLang unit of the host is retired, as the deploy retires one.
        replacement = unit.Replacement(view.service, [])
        drain.drain_retired(name="SGLang units leave the gateways", replacement=replacement,
                            gateways=membership.gateways(membership.of(inventory), host))
        unit.retired(name="SGLang units", replacement=replacement)
        unit.removed(name="SGLang units removed", replacement=replacement)
    # Its name is what pyinfra shows before it asks: what goes, and whether the weights stay.
    uninstall.removed(name=uninstall.summary(plan, left, view.service.service_prefix if view.service else None),
                      uninstall=plan)
