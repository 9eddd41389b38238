"""specfleet's tuner: measure the speculative settings and layouts a deployed host may serve with, keep the best.

    pyinfra inventory/ct200.py tune.py --data profile=qwen36_ddtree                     # throughput at 1,8
    pyinfra inventory/ct200.py tune.py --data concurrency=1,8,32 --data objective=latency
    pyinfra inventory/ct200.py tune.py --data objective=throughput --data max_tpot_ms=25 --data search=grid
    pyinfra inventory/ct200.py tune.py --data prompts=my-prompts.jsonl                 # your workload
    pyinfra inventory/ct200.py tune.py --data algorithms=ar,dflash,ddtree,mtp          # which algorithm wins

For each deployment of each host, the candidates (tuning/candidates.py: every profile of its model, each
algorithm it serves with the settings it tries, at each layout the GPUs divide into and the KV plan and the
weights fit, autoregressive decoding as the baseline; `--data algorithms=...` chooses among the algorithms;
the SGLang build of each profile compared is installed beside the deployed one) are served in turn by the
serving benchmark's machinery (bench.py's: transient units in the deployed replicas' place, the replicas
drained from their gateways first and the deployed ones started again at the end, whatever happens), in the
order the search asks for them (tuning/search.py); the table of every trial, the algorithms compared at each
concurrency, its plot and the pick land beside the bench's results, and the pick (its profile included) in
SPECFLEET_SITE/tuned/<class>/<profile>.json, which the next deploy serves. Knobs: tuning/plan.py.
"""

from pyinfra import host, inventory

from deployment import hosts, roles, schema
from operations.basics import deploy_files, failing
from operations.run import preflight
from operations.weights import checks as weights_checks
from operations.server.stages import builds_installed
from serving_benchmark import behind_gateway, client
from tuning import candidates, trials
from tuning.plan import plan as tuning_plan

deploy_files.named_for_inspect(__file__)  # pyinfra's operation order, without a scan of every module per call
failing.dry_is_a_gate(host.state)  # --dry -y says every refusal --dry says, and exits 1 on one

schema.check_inventory(inventory)  # a misspelt knob (`objectve`) stops the run before any host changes
# A gateway without GPUs (in no class group) serves nothing to measure: it only routes the workers' levels.
worker, deployments, plan = preflight.resolved(inventory, tuning_plan) \
    if roles.serves_model(host.groups) or not roles.is_gateway(host.groups) else (None, (), None)

if deployments:
    client.installed(worker.service, plan.bench)
    # The SGLang builds of the model's other profiles it compares, beside the deployed ones (the next deploy
    # prunes those no deployment wants).
    compared = [c.deployment.engine for d in deployments
                for c in candidates.candidates(host.data, d.host.host_class, d.name, algorithms=plan.algorithms)[0]]
    builds_installed(worker.service, tuple(compared))
    for d in host.loop(deployments):
        hub = weights_checks.hub_state(d.weights)  # the KV plan of each layout reads the models' configs
        d = hosts.at_commits(d, hub.commits)
        routes, drained = behind_gateway.drained(inventory, host, d.replicas)
        trials.tune(name=f"Tune {d.name}", d=d, data=host.data, plan=plan, hub=hub, smoke=d.host.smoke,
                    routes=routes, drained=drained)
