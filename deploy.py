"""specfleet: turn each inventory host into an SGLang server running speculative decoding.

    pyinfra inventory/ct200.py deploy.py            # converge (a second run changes nothing)
    pyinfra inventory/ct200.py deploy.py --dry      # show what would change

The deployment's table of contents: each stage is one subject's entry in operations/<subject>/.
Nothing changes on a host until its preflight passes. A host whose data cannot be deployed, or
whose hub checks fail, is refused with one sentence; the other hosts go on. Hosts of the `gateway`
group also get SGLang's model gateway (stage 7) and Prometheus scraping it and its workers
(stage 8); a gateway-only host (in no class group) has no GPU and gets only those.
"""

import functools

from pyinfra import host, inventory

from deployment import hosts, roles, schema
from deployment.gateway import config as gateway_config, membership
from deployment.knobs import BadHostData
from deployment.nodes import group as nodes
from operations.basics import deploy_files, failing
from operations.gateway import drain, registry
from operations.gateway.stages import gateway_deployed
from operations.gpu import smoke
from operations.gpu.stages import gpu_runtime
from operations.monitoring import prometheus
from operations.monitoring.stages import monitoring_deployed
from operations.nodes import rendezvous
from operations.run import preflight, summary
from operations.server import capacity_record, sandbox, unit
from operations.server.stages import builds_pruned, server_installed, server_serving
from operations.weights import revisions, hf_token
from operations.weights.stages import weights_fetched

deploy_files.named_for_inspect(__file__)  # pyinfra's operation order, without a scan of every module per call
failing.dry_is_a_gate(host.state)  # --dry -y says every refusal --dry says, and exits 1 on one

# A key no knob has, in any layer (--data, inventory, group data), stops the run before any host changes.
schema.check_inventory(inventory)
worker, deployments, gateway, monitoring = None, (), None, None
try:
    # Every knob of every subject, parsed and checked before any host changes: the host's deployments
    # (one model, or several on disjoint GPUs), a host of a node group with its group's members. A host
    # in no class group is refused (by host_class_of) unless it is a gateway without GPUs.
    if roles.serves_model(host.groups) or not roles.is_gateway(host.groups):
        worker, deployments = hosts.resolve_worker(host.data, hosts.host_class_of(host.groups),
                                                        nodes.members(inventory, host))
        summary.tuned_report(host.name, deployments)  # where each setting came from: class, profile or tuned file
    if roles.is_gateway(host.groups):
        gateway, monitoring = gateway_config.resolve(host.data), prometheus.resolve(host.data)
    # What a host serves is the group data's: a --data choice of it would last this run alone.
    if refusal := schema.deploy_data_refused(inventory.get_override_data()):
        raise BadHostData(refusal)
except BadHostData as problem:
    worker, deployments, gateway, monitoring = None, (), None, None
    preflight.refuse(problem=f"{host.name}: {problem}")
# The inventory as the gateways see it (every host's replicas and gateway), resolved once in the run.
fleet = membership.of(inventory)

if deployments:
    # 1. Preflight: hardware, driver, token and repo access, each replica's GPUs and memory, disk, DDTree
    #    build, exposure. The host's state is read in one round trip while the hub answers; each deployment
    #    goes on at the commits the hub resolved its revisions to.
    hubs = preflight.host_and_hub_read(deployments)
    deployments = tuple(hosts.at_commits(d, hub.commits) for d, hub in zip(deployments, hubs))
    preflight.check(name="Preflight", worker=worker, deployments=deployments, hubs=hubs)
    for d in deployments:
        if d.node_group:
            # One server over several nodes (a host's only deployment): every node reaches rank 0's dist-init port.
            rendezvous.reachable(name="Nodes reach rank 0", group=d.node_group)

# Nothing below is prepared for a host whose hub checks failed, or that preflight refused while pyinfra
# evaluated it before the run (--dry): preflight has reported them. A gated repo still waiting for access
# stops only a host that serves (preflight); one serving nothing yet is prepared up to its downloads, then
# fails naming the repo's terms page (stage 5).
refused = failing.refused(host)
if deployments and not refused and not any(hub.problems for hub in hubs):
    # 2. The GPU runtime the class needs: the driver (install_driver), persistence, fabric manager.
    gpu_runtime(worker.gpu)
    # 3. What the servers run as and from: their user, root's directories, their API key, each SGLang
    #    build's virtualenv and the host programs; the HF token (written by the service user).
    keys = server_installed(worker.service, tuple(d.engine for d in deployments))
    # A gateway's admin key stays on its host: the gateways' hosts drain and register these replicas.
    drain.no_admin_key(name="No gateway admin key", service=worker.service)
    hf_token.hf_token(name="Hugging Face token", token_env=worker.hf_token_env, service=worker.service)
    # 4. The GPUs run SGLang's collectives before anything long is loaded.
    smoke.allreduce(name="GPU smoke test", smoke=worker.smoke)
    # 5. Weights, pinned and verified, each revision beside the others, fetched by units that survive a
    #    dropped connection; a revision several hosts of the run deploy comes from the hub once, the hosts
    #    serving it to each other (nginx) while they fetch it.
    weights_fetched(tuple(d.weights for d in deployments), hubs, fleet.workers)

if deployments and not refused and all(hub.complete for hub in hubs):  # serving needs every repo's weights
    # 6. The units, one per replica. A change of what the host serves (another profile, layout or replica
    #    count) is one change: the units no deployment wants any more leave the gateways and stop first
    #    (their GPUs and ports may be a new replica's), and stay restorable until every wanted replica
    #    generates; then they are removed. Each replica in turn, so the host keeps serving while it changes:
    #    restarted only when its inputs change (one decision per replica, which its drain asks too), proven
    #    to generate, back in its gateways. One that fails readiness is rolled back to its previous unit (and
    #    revision), or where the run replaces units, every new replica stops and the replaced units serve
    #    again, back in the gateways they left; the failed replica stays out until a run deploys it
    #    healthy. A drain waits for the replica's requests in flight. Every replica's new files are
    #    validated by the host's SGLang (its resolution, and its scheduler's startup arithmetic on this
    #    host's GPUs and weights) before any unit changes. rollout.py does the fleet N hosts at a time.
    #    Each unit's environment holds the GPU smoke test's P2P decision for this host (stage 4). Each
    #    replica's KV plan is kept beside its unit, what tests/deployed holds its engine's own
    #    max_total_num_tokens to.
    routes = {replica.service_name: membership.routes(fleet, host, replica)  # none: rank >= 1
              for d in deployments for replica in d.replicas}
    # Each unit admits packets from loopback, its node group and the gateways routing it alone (the TCPStore).
    restarts = [[unit.Restart(replica, unit.inputs(d.engine, d.weights.commits), restart_when=keys[d.name],
                              decided_env=functools.partial(smoke.decided_env, worker.smoke),
                              allowed=sandbox.reached_from(replica, membership.addresses(routes[replica.service_name]),
                                                           d.node_group),
                              startup=True, min_kv_tokens=worker.min_kv_tokens)
                 for replica in d.replicas] for d in deployments]
    every = [restart for each in restarts for restart in each]
    replacement = unit.Replacement(worker.service, every)
    drain.drain_retired(name="Retired units leave the gateways", replacement=replacement,
                        gateways=membership.gateways(fleet, host))
    unit.retired(name="Units no deployment wants", replacement=replacement)
    for d, hub, decisions in host.loop(list(zip(deployments, hubs, restarts))):
        for replica, restart in host.loop(list(zip(d.replicas, decisions))):
            if routes[replica.service_name]:
                drain.drain(name=f"Drain {replica.service_name} from the gateway", server=replica,
                            routes=routes[replica.service_name], restart=restart)
            server_serving(replica, restart, weight_bytes=hub.total_bytes, group=d.node_group, replacement=replacement)
            if not d.node_group or d.node_group.serves_http:  # the replica whose engine reports its KV pool
                capacity_record.kept(name=f"KV plan of {replica.service_name}", server=replica,
                                     expected=worker.gpu.expected, snapshots=hub.snapshots)
            if routes[replica.service_name]:
                drain.rejoin(name=f"{replica.service_name} back in the gateway", server=replica,
                             routes=routes[replica.service_name])
    unit.removed(name="Replaced units removed", replacement=replacement)
    # Every replica serves the wanted revisions: the previous one of each repo is kept while the disk
    # allows, older ones are deleted, each said.
    revisions.pruned(name="Weights revisions", weights=tuple(d.weights for d in deployments), service=worker.service)
    # So are the SGLang builds: those no deployment wants and no unit (nor its rollback) uses are removed.
    builds_pruned(worker.service, tuple(d.engine for d in deployments))

# 7. The gateway, after every worker's readiness (every host passes `workers_done`, which orders the
#    stage after the workers'): smg in its own virtualenv, its key, its unit, the inventory's workers.
if any(roles.is_gateway(other.groups) for other in inventory):
    registry.workers_done(name="Workers done")
if gateway and not refused:
    wanted = membership.workers(fleet, host, gateway.model)
    gateway_deployed(gateway, wanted, uv_installed=bool(deployments), addresses=membership.worker_addresses(fleet, host))
    # 8. Prometheus (Debian's package) scraping smg and the gateway's workers, every target checked up.
    monitoring_deployed(monitoring, host.name, gateway, wanted)

# The run's table: every host, its class, models, endpoints, gateway, state and accept length, printed
# once every host reached this last operation.
summary.summarize(host, worker, deployments, gateway,
                  tuple(dict.fromkeys(route.gateway for d in deployments for replica in d.replicas
                                      for route in membership.routes(fleet, host, replica))))
