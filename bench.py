"""specfleet's serving benchmark: how fast what was deployed serves, per mode, as a concurrency sweep.

    pyinfra inventory/ct200.py bench.py                                   # ar, dflash, ddtree at 1,4,16,64
    pyinfra inventory/ct200.py bench.py --data modes=ar,dflash --data concurrency=1,8
    pyinfra inventory/ct200.py bench.py --data prompts=my-prompts.jsonl            # your workload
    pyinfra inventory/ct200.py bench.py --data baseline=bench-results/RUN/HOST/summary.json

Each host serves each mode in turn on every replica of its deployment (its deployed units stopped
meanwhile, started again at the end), runs aiperf next to the servers (on each replica alone, then on
all of them at once) with the prompts (serving_benchmark/prompts.jsonl, else --data prompts=FILE), and
its results land in bench-results/RUN/HOST/ on the controller (HOST/DEPLOYMENT/ for a host serving
several models). A replica behind a gateway is drained from it first and registered again once its
deployed unit generates; then each level runs through that gateway too, when its only workers of the
model are this host's replicas. Knobs: deployment/schema.py declares them, serving_benchmark/plan.py reads
them. (The toolkit's own speed series is another thing: speed/, `make speed`.)
"""

from pyinfra import host, inventory

from deployment import roles, schema
from operations.basics import deploy_files, failing
from operations.run import preflight
from serving_benchmark import behind_gateway, client, modes, sweep
from serving_benchmark.plan import plan as bench_plan

deploy_files.named_for_inspect(__file__)  # pyinfra's operation order, without a scan of every module per call
failing.dry_is_a_gate(host.state)  # --dry -y says every refusal --dry says, and exits 1 on one

schema.check_inventory(inventory)  # a key no knob has (a misspelt `modes`) stops the run before any host changes
# A gateway without GPUs (in no class group) serves nothing to measure: it only routes the workers' levels.
worker, deployments, plan = preflight.resolved(inventory, bench_plan) \
    if roles.serves_model(host.groups) or not roles.is_gateway(host.groups) else (None, (), None)

if deployments:
    client.installed(worker.service, plan)  # the host's, beside its servers: one for every deployment
    for d in host.loop(deployments):  # each model of the host on its own, its replicas together
        # A replica behind a gateway leaves it before its server stops, and comes back once its deployed
        # unit generates again (gateway/drain.py, then serving_benchmark/behind_gateway.py back_in_gateways, as a
        # deploy's restart does).
        routes, drained = behind_gateway.drained(inventory, host, d.replicas)
        sweep.sweep(name=f"Benchmark sweep {d.name}", replicas=d.replicas, plan=plan, smoke=d.host.smoke, routes=routes,
                    drained=drained, results_subdir=d.name if len(deployments) > 1 else "",
                    settings=modes.of_model(host.data.profiles, d.engine.profile_name))
