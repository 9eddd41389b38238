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
model are this host's replicas. Knobs: serving_benchmark/plan.py (DEFAULTS, plan()). (The toolkit's own speed series
is another thing: speed/, `make speed`.)
"""

from pyinfra import host, inventory

from operations import deployment, schema
from operations.basics import deploy_files
from operations.basics.knobs import BadHostData
from operations.deployment import preflight
from operations.gateway import drain, membership
from operations.nodes import group as nodes
from operations.python import venv
from serving_benchmark import client, sweep
from serving_benchmark.plan import plan as bench_plan

deploy_files.named_for_inspect(__file__)  # pyinfra's operation order, without a scan of every module per call

schema.check_inventory(inventory)  # a key no knob has (a misspelt `modes`) stops the run before any host changes
worker, deployments = None, ()
try:
    worker, deployments = deployment.resolve_worker(host.data, deployment.host_class_of(host.groups),
                                                    nodes.members(inventory, host))
    plan = bench_plan(host.data)
except BadHostData as problem:
    worker, deployments = None, ()
    preflight.refuse(problem=f"{host.name}: {problem}")

if deployments:
    # The client, its prompts and tokenizer are the host's, beside its servers: one for every deployment.
    venv.requirement(name="Benchmark client (aiperf)", path=f"{worker.service.install_dir}/bench-venv",
                     distribution="aiperf", requirement=client.CLIENT_REQUIREMENT,
                     index_url=worker.service.pip_index_url)
    client.tokenizer(name="Benchmark tokenizer", service=worker.service, source=plan.tokenizer)
    client.prompts(name="Benchmark prompts", service=worker.service, plan=plan)
    for d in host.loop(deployments):  # each model of the host on its own, its replicas together
        # A replica behind a gateway leaves it before its server stops, and comes back once its deployed
        # unit generates again (gateway/drain.py, then serving_benchmark/behind_gateway.py join_again, as a
        # deploy's restart does).
        routes, drained, fleet = [], [], membership.of(inventory)
        for replica in host.loop(d.replicas):
            routes.append(membership.routes(fleet, host, replica))
            drained.append(drain.drain(name=f"Drain {replica.service_name} from the gateway", server=replica,
                                       routes=routes[-1], restart=None) if routes[-1] else None)
        sweep.sweep(name=f"Benchmark sweep {d.name}", replicas=d.replicas, plan=plan, smoke=d.host.smoke, routes=routes,
                    drained=drained, results_subdir=d.name if len(deployments) > 1 else "")
