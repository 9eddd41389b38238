"""specfleet bench: how fast what was deployed serves, per mode, as a concurrency sweep.

    pyinfra inventory/ct200.py bench.py                                   # ar, dflash, ddtree at 1,4,16,64
    pyinfra inventory/ct200.py bench.py --data modes=ar,dflash --data concurrency=1,8
    pyinfra inventory/ct200.py bench.py --data baseline=bench-results/RUN/HOST/summary.json

Each host serves each mode in turn (its deployed service stopped meanwhile, started again at the
end), runs aiperf next to the server, and its results land in bench-results/RUN/HOST/ on the
controller. Knobs: operations/benchmark.py (DEFAULTS, plan()).
"""

from pyinfra import host

from operations import benchmark, venv
from operations.deployment import host_class_of, resolve

host_class = host_class_of(host.groups)
deployment = resolve(host.data, host_class)
plan = benchmark.plan(host.data)

# A host a gateway routes to is refused unless forced (nothing below runs on a failed host).
benchmark.not_behind_gateway(name="Not behind a gateway", gateway=host.data.get("gateway"), force=plan.force)
venv.requirement(name="Benchmark client (aiperf)", path=f"{deployment.install_dir}/bench-venv",
                 distribution="aiperf", requirement=benchmark.CLIENT_REQUIREMENT, index_url=deployment.pip_index_url)
benchmark.tokenizer(name="Benchmark tokenizer", deployment=deployment, source=plan.tokenizer)
benchmark.sweep(name="Benchmark sweep", deployment=deployment, plan=plan, host_class=host_class)
