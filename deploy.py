"""specfleet: turn each inventory host into an SGLang server running speculative decoding.

    pyinfra inventory/ct200.py deploy.py            # converge (a second run changes nothing)
    pyinfra inventory/ct200.py deploy.py --dry      # what would change, and every refusal the run would make

The deployment's table of contents: each stage is one subject's entry in operations/<subject>/.
Nothing changes on a host until its preflight passes. A host whose data cannot be deployed, or
whose hub checks fail, is refused with one sentence; the other hosts go on. Hosts of the `gateway`
group also get SGLang's model gateway (stage 7) and Prometheus scraping it and its workers
(stage 8); a gateway-only host (in no class group) has no GPU and gets only those.
"""

import functools

from pyinfra import host, inventory

from operations import deployment
from operations.basics import failing
from operations.basics.knobs import BadHostData
from operations.deployment import preflight, summary
from operations.gateway import config as gateway_config, workers
from operations.gateway.stages import gateway_deployed
from operations.gpu import smoke
from operations.gpu.stages import gpu_runtime
from operations.monitoring import prometheus
from operations.monitoring.stages import monitoring_deployed
from operations.nodes import group as nodes, rendezvous
from operations.server import unit
from operations.server.stages import server_installed, server_serving
from operations.weights import checks as weights_checks, token
from operations.weights.stages import weights_fetched

d = g = m = None
try:
    # Every knob of every subject, parsed and checked before any host changes; a host of a node
    # group with its group's members.
    if workers.serves_model(host.groups):
        d = deployment.resolve(host.data, deployment.host_class_of(host.groups), nodes.members(inventory, host))
    if workers.GROUP in host.groups:
        g, m = gateway_config.resolve(host.data), prometheus.resolve(host.data)
except BadHostData as problem:
    d = g = m = None
    preflight.refuse(name="Preflight", problem=f"{host.name}: {problem}")

if d:
    # 1. Preflight: hardware, driver, token and repo access, GPU memory, disk, DDTree build, exposure.
    hub = weights_checks.hub_state(d.weights)
    preflight.check(name="Preflight", deployment=d, hub=hub)
    if d.node_group:
        # One server over several nodes: every node reaches rank 0's dist-init port.
        rendezvous.reachable(name="Nodes reach rank 0", group=d.node_group)

# Nothing below is prepared for a host whose hub checks failed, or that preflight refused while pyinfra
# evaluated it before the run (--dry): preflight has reported them. A gated repo still waiting for access
# stops only a host that serves (preflight); one serving nothing yet is prepared up to its downloads, then
# fails naming the repo's terms page (stage 5).
refused = failing.refused(host)
if d and not refused and not hub.problems:
    # 2. The GPU runtime the class needs: the driver (install_driver), persistence, fabric manager.
    gpu_runtime(d.gpu)
    # 3. What the server runs as and from: its user, root's directories, its API key, SGLang's
    #    virtualenv and the host programs; the HF token (written by the service user).
    api_key = server_installed(d.server)
    token.hf_token(name="Hugging Face token", weights=d.weights)
    # 4. The GPUs run SGLang's collectives before anything long is loaded.
    smoke.allreduce(name="GPU smoke test", smoke=d.smoke)
    # 5. Weights, pinned and verified, fetched by units that survive a dropped connection.
    weights_fetched(d.weights, hub)

if d and not refused and hub.complete:  # serving needs every repo's weights
    # 6. The unit (restarted only when its inputs change: one decision, which the drain asks too), then
    #    proof that it generates. A worker behind a gateway leaves it before the restart, waits for its
    #    requests in flight, and comes back once it generates (rollout.py does the fleet N workers at a
    #    time); one that fails readiness is rolled back and stays out until a run deploys it healthy.
    #    The unit's environment holds the GPU smoke test's P2P decision for this host (stage 4).
    restart = unit.Restart(d.server, unit.inputs(d.server, hub.commits), restart_when=[api_key],
                           decided_env=functools.partial(smoke.decided_env, d.smoke))
    routes = workers.routes(inventory, host, d.server.served_model_name)  # none for a rank >= 1
    if routes:
        workers.admin_key(name="Gateway admin key", server=d.server, routes=routes)
        workers.drain(name="Drain from the gateway", server=d.server, routes=routes, restart=restart)
    server_serving(d.server, restart, weight_bytes=hub.total_bytes, group=d.node_group)
    if routes:
        workers.rejoin(name="Back in the gateway", server=d.server, routes=routes)

# 7. The gateway, after every worker's readiness (every host passes `workers_done`, which orders the
#    stage after the workers'): smg in its own virtualenv, its key, its unit, the inventory's workers.
if any(workers.GROUP in other.groups for other in inventory):
    workers.workers_done(name="Workers done")
if g and not refused:
    gateway_deployed(g, inventory, host, uv_installed=d is not None)
    # 8. Prometheus (Debian's package) scraping smg and the gateway's workers, every target checked up.
    monitoring_deployed(m, host.name, g, workers.workers(inventory, host, g.model))

# The run's table: every host, its class, model, endpoint, gateway, state and accept length, printed once
# every host reached this last operation.
summary.summarize(host, d, g)
