"""specfleet bench: how fast what was deployed serves, per mode, as a concurrency sweep.

    pyinfra inventory/ct200.py bench.py                                   # ar, dflash, ddtree at 1,4,16,64
    pyinfra inventory/ct200.py bench.py --data modes=ar,dflash --data concurrency=1,8
    pyinfra inventory/ct200.py bench.py --data baseline=bench-results/RUN/HOST/summary.json

Each host serves each mode in turn (its deployed service stopped meanwhile, started again at the
end), runs aiperf next to the server, and its results land in bench-results/RUN/HOST/ on the
controller. Knobs: operations/sweep.py (DEFAULTS, plan()).
"""

from pyinfra import host

from serving_benchmark import sweep
from operations.python import venv
from operations.deployment.config import host_class_of, resolve

host_class = host_class_of(host.groups)
deployment = resolve(host.data, host_class)
plan = sweep.plan(host.data)

# A host a gateway routes to is refused unless forced (nothing below runs on a failed host).
sweep.not_behind_gateway(name="Not behind a gateway", gateway=host.data.get("gateway"), force=plan.force)
venv.requirement(name="Benchmark client (aiperf)", path=f"{deployment.install_dir}/bench-venv",
                 distribution="aiperf", requirement=sweep.CLIENT_REQUIREMENT, index_url=deployment.pip_index_url)
sweep.tokenizer(name="Benchmark tokenizer", deployment=deployment, source=plan.tokenizer)
sweep.sweep(name="Benchmark sweep", deployment=deployment, plan=plan, host_class=host_class)
