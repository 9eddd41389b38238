"""specfleet's serving benchmark: how fast what was deployed serves, per mode, as a concurrency sweep.

    pyinfra inventory/ct200.py bench.py                                   # ar, dflash, ddtree at 1,4,16,64
    pyinfra inventory/ct200.py bench.py --data modes=ar,dflash --data concurrency=1,8
    pyinfra inventory/ct200.py bench.py --data prompts=my-prompts.jsonl            # your workload
    pyinfra inventory/ct200.py bench.py --data baseline=bench-results/RUN/HOST/summary.json

Each host serves each mode in turn (its deployed service stopped meanwhile, started again at the
end), runs aiperf next to the server with the prompts (serving_benchmark/prompts.jsonl, else
--data prompts=FILE), and its results land in bench-results/RUN/HOST/ on the controller. A worker
behind a gateway is drained from it first and registered again once its deployed service
generates. Knobs: serving_benchmark/sweep.py (DEFAULTS, plan()). (The toolkit's own speed series
is another thing: speed/, `make speed`.)
"""

from pyinfra import host, inventory

from operations import deployment
from operations.basics.knobs import BadHostData
from operations.deployment import preflight
from operations.gateway import workers
from operations.nodes import group as nodes
from operations.python import venv
from serving_benchmark import sweep

try:
    d = deployment.resolve(host.data, deployment.host_class_of(host.groups), nodes.members(inventory, host))
    server = d.server
    plan = sweep.plan(host.data)
except BadHostData as problem:
    server = None
    preflight.refuse(name="Benchmark knobs", problem=f"{host.name}: {problem}")

if server:
    # A worker behind a gateway leaves it before its server stops, and comes back once the deployed
    # service generates again (gateway/workers.py drain and join_again, as a deploy's restart does).
    routes = workers.routes(inventory, host, server.served_model_name)
    venv.requirement(name="Benchmark client (aiperf)", path=f"{server.install_dir}/bench-venv",
                     distribution="aiperf", requirement=sweep.CLIENT_REQUIREMENT, index_url=server.pip_index_url)
    sweep.tokenizer(name="Benchmark tokenizer", server=server, source=plan.tokenizer)
    sweep.prompts(name="Benchmark prompts", server=server, plan=plan)
    drained = workers.drain(name="Drain from the gateway", server=server, routes=routes, restart=None) \
        if routes else None
    sweep.sweep(name="Benchmark sweep", server=server, plan=plan, smoke=d.smoke, routes=routes, drained=drained)
