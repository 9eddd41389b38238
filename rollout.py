"""Roll deploy.py over a fleet N workers (or node groups) at a time, stopping at the first batch that fails.

    python rollout.py inventory/ct200.py                        # one worker at a time
    python rollout.py inventory/b200.py --batch 2 --data profile=qwen36_ddtree

Each batch is one `pyinfra -y INVENTORY deploy.py --limit HOST...` run (pyinfra's --serial is one
host at a time and --parallel chunks each operation, so neither finishes a batch before the
next). Within a run, every worker whose server restarts drains itself from its gateways first
and registers again once it generates; a worker that fails readiness is rolled back to its
previous unit, stays out of the gateway and fails the run, and the rollout stops there: the
later batches are not touched. A node group's hosts are one unit of a batch (deployed in the same
run). The gateway-only hosts come last, in one run of their own.
Options other than --batch go to pyinfra as they are (--data, --group-data, -v, ...).
"""

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent


def batches(inventory_path: str, size: int, data: dict | None = None) -> list[list[str]]:
    """The inventory's workers in batches of `size` units (`plan`), then its gateway-only hosts; a key no knob
    has, in the inventory or in `data` (--data), stops the rollout before its first batch (operations/schema.py)."""
    sys.path.insert(0, str(REPO))  # inventories and deploy code import the repository's packages, as pyinfra's CLI does
    from pyinfra.api import State
    from pyinfra.context import ctx_state
    from pyinfra_cli.inventory import make_inventory

    from operations import schema

    with ctx_state.use(State()):  # pyinfra reads an inventory file inside a state, as its CLI does
        inventory = make_inventory(inventory_path, cwd=os.getcwd(), override_data=data)
    schema.check_inventory(inventory)
    return plan(list(inventory), size)


def data_options(options: list[str]) -> dict:
    """The --data KEY=VALUE (or --data=KEY=VALUE) options among pyinfra's, as pyinfra's CLI reads them."""
    from operations import schema

    return schema.cli_data([value for option, value in zip(options, options[1:]) if option == "--data"] +
                           [option.split("=", 1)[1] for option in options if option.startswith("--data=")])


def plan(hosts, size: int) -> list[list[str]]:
    """Host names in batches of `size` units, in inventory order, then the gateway-only hosts.

    A unit is one worker, or every host of a node group: its ranks serve one server together
    (rank 0 cannot serve while another rank restarts), so they are deployed in the same run.
    """
    from operations.gateway.workers import GROUP, serves_model

    units: dict[tuple[str, str], list[str]] = {}
    for h in hosts:
        if serves_model(h.groups):
            group = getattr(h.data, "node_group", None)
            units.setdefault(("node group", group) if group else ("host", h.name), []).append(h.name)
    ordered = list(units.values())
    gateways = [h.name for h in hosts if GROUP in h.groups and not serves_model(h.groups)]
    return [[name for unit in ordered[i:i + size] for name in unit] for i in range(0, len(ordered), size)] + \
        ([gateways] if gateways else [])


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     usage="python rollout.py INVENTORY [--batch N] [pyinfra options]")
    parser.add_argument("inventory")
    parser.add_argument("--batch", type=int, default=1, help="workers (a node group counts as one) deployed together (default 1)")
    args, pyinfra_options = parser.parse_known_args(argv)
    if args.batch < 1:
        parser.error(f"--batch={args.batch} is not a whole number at least 1")
    plan = batches(args.inventory, args.batch, data_options(pyinfra_options))
    started = time.monotonic()
    for number, batch in enumerate(plan, 1):
        print(f"rollout: batch {number}/{len(plan)}: {', '.join(batch)}", flush=True)
        began = time.monotonic()
        run = subprocess.run([sys.executable, "-m", "pyinfra", "-y", args.inventory, str(REPO / "deploy.py"),
                              *(option for name in batch for option in ("--limit", name)), *pyinfra_options])
        if run.returncode:
            untouched = [name for later in plan[number:] for name in later]
            print(f"rollout: batch {number}/{len(plan)} failed (exit {run.returncode}) after "
                  f"{time.monotonic() - began:.0f} s; stopped. Not touched: {', '.join(untouched) or 'none'}",
                  flush=True)
            return run.returncode
        print(f"rollout: batch {number}/{len(plan)} done in {time.monotonic() - began:.0f} s", flush=True)
    print(f"rollout: {len(plan)} batches done in {time.monotonic() - started:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
