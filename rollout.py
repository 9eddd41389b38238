"""Roll deploy.py over a fleet N workers (or node groups) at a time, stopping at the first batch that fails.

    python rollout.py inventory/ct200.py                        # one worker at a time
    python rollout.py inventory/b200.py --batch 2 --data longest_generation_s=1200

Each batch is one `pyinfra -y INVENTORY deploy.py --limit HOST...` run (pyinfra's --serial is one
host at a time and --parallel chunks each operation, so neither finishes a batch before the
next). Within a run, every worker whose server restarts drains itself from its gateways first
and registers again once it generates; a worker that fails readiness is rolled back to its
previous unit, stays out of the gateway and fails the run, and the rollout stops there: the
later batches are not touched. A node group's hosts are one unit of a batch (deployed in the same
run). The gateway-only hosts come last, in one run of their own.

    python rollout.py inventory/b200.py --limit b200-2 --limit pcie   # only these hosts, batched

--limit and --exclude (pyinfra's patterns: a host or group name, or a glob) narrow the hosts the
rollout batches; each batch's run is limited to its own hosts alone (pyinfra joins repeated --limit
options, so passing the user's on would put every limited host in every batch). A node group is
deployed whole or not at all. With install_driver on, a host whose driver changes reboots: the
rollout asks first, as pyinfra's own prompt does, unless -y.
Other options go to pyinfra as they are (--data, --group-data, -v, ...).
"""

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent


class Refused(ValueError):
    """A selection the rollout cannot deploy as asked; the message is one line saying why."""


def survey(inventory_path: str, size: int, limit=(), exclude=(), data=(), group_data=()) \
        -> tuple[list[list[str]], list[str]]:
    """(the selected hosts in batches, `plan`; those of them whose deploy may install a driver and reboot).

    The inventory is read as pyinfra's CLI reads it (its --data and --group-data applied), and the
    selection made by the CLI's own --limit/--exclude matching.
    """
    sys.path.insert(0, str(REPO))  # inventories and deploy code import the repository's packages, as pyinfra's CLI does
    from pyinfra.api import State
    from pyinfra.context import ctx_state
    from pyinfra_cli.cli import _apply_inventory_exclude, _apply_inventory_limit, _set_override_data
    from pyinfra_cli.inventory import make_inventory

    from deployment import knobs, schema
    from deployment.roles import serves_model

    with ctx_state.use(State()):  # pyinfra reads an inventory file inside a state, as its CLI does
        inventory = make_inventory(inventory_path, cwd=os.getcwd(), group_data_directories=group_data,
                                   override_data=_set_override_data(data, None, None, None, None, None))
        schema.check_inventory(inventory)  # a key no knob has, in the inventory or its --data: one line, no batch
        hosts = list(inventory)
        chosen = _apply_inventory_exclude(inventory, _apply_inventory_limit(inventory, limit), exclude)
        selected = hosts if chosen is None else [h for h in hosts if h in chosen]
        whole_node_groups(hosts, selected)
        try:
            installing = [h.name for h in selected if serves_model(h.groups)
                          and knobs.boolean("install_driver", h.data.install_driver)]
        except knobs.BadHostData as problem:
            raise Refused(str(problem)) from None
        return plan(selected, size), installing


def batches(inventory_path: str, size: int, limit=()) -> list[list[str]]:
    """The inventory's workers (those `limit` selects) in batches of `size` units, then its gateway-only hosts."""
    return survey(inventory_path, size, limit)[0]


def whole_node_groups(hosts, selected) -> None:
    """Refuse a selection holding some of a node group's hosts but not all: its ranks serve one server
    together, so deploying one restarts it under the others."""
    chosen = {h.name for h in selected}
    groups: dict[str, list[str]] = {}
    for h in hosts:
        group = getattr(h.data, "node_group", None)
        if group:
            groups.setdefault(group, []).append(h.name)
    for group, members in groups.items():
        left = [name for name in members if name not in chosen]
        if len(left) < len(members) and left:
            raise Refused(f"node group {group} is deployed whole: the selection leaves out {', '.join(left)} "
                          f"(add --limit {group} or name every member)")


def plan(hosts, size: int) -> list[list[str]]:
    """Host names in batches of `size` units, in inventory order, then the gateway-only hosts.

    A unit is one worker, or every host of a node group: its ranks serve one server together
    (rank 0 cannot serve while another rank restarts), so they are deployed in the same run.
    """
    from deployment.roles import is_gateway, serves_model

    units: dict[tuple[str, str], list[str]] = {}
    for h in hosts:
        if serves_model(h.groups):
            group = getattr(h.data, "node_group", None)
            units.setdefault(("node group", group) if group else ("host", h.name), []).append(h.name)
    ordered = list(units.values())
    gateways = [h.name for h in hosts if is_gateway(h.groups) and not serves_model(h.groups)]
    return [[name for unit in ordered[i:i + size] for name in unit] for i in range(0, len(ordered), size)] + \
        ([gateways] if gateways else [])


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     usage="python rollout.py INVENTORY [--batch N] [pyinfra options]")
    parser.add_argument("inventory")
    parser.add_argument("--batch", type=int, default=1, help="workers (a node group counts as one) deployed together (default 1)")
    parser.add_argument("--limit", action="append", default=[], help="only these hosts or groups (pyinfra's patterns)")
    parser.add_argument("--exclude", action="append", default=[], help="not these hosts or groups (pyinfra's patterns)")
    args, pyinfra_options = parser.parse_known_args(argv)
    if args.batch < 1:
        parser.error(f"--batch={args.batch} is not a whole number at least 1")
    # Read, and passed on to pyinfra as they are.
    passed = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    passed.add_argument("--data", action="append", default=[])
    passed.add_argument("--group-data", action="append", default=[])
    passed.add_argument("-y", "--yes", action="store_true", 
                        default=os.environ.get("PYINFRA_YES", "").lower() in ("1", "true", "yes", "on"))
    passed.add_argument("--dry", action="store_true")
    options = passed.parse_known_args(pyinfra_options)[0]
    try:
        plan, installing = survey(args.inventory, args.batch, args.limit, args.exclude, options.data,
                                  options.group_data)
    except Refused as problem:
        print(f"rollout: refused, nothing deployed: {problem}", file=sys.stderr, flush=True)
        return 2
    if not plan:
        print("rollout: no host selected; nothing deployed", file=sys.stderr, flush=True)
        return 2
    if installing and not options.yes and not options.dry and not confirmed(installing):
        print("rollout: stopped before the first batch; nothing deployed", file=sys.stderr, flush=True)
        return 1
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
    batches = "1 batch" if len(plan) == 1 else f"{len(plan)} batches"
    print(f"rollout: {batches} done in {time.monotonic() - started:.0f} s", flush=True)
    return 0


def confirmed(installing: list[str]) -> bool:
    """Ask, as pyinfra's own prompt does, before a rollout that may reboot hosts (install_driver on)."""
    print(f"\n    install_driver is on for {', '.join(installing)}: a host whose driver changes reboots "
          "during its batch.", file=sys.stderr)
    print("    Press enter to roll out (Ctrl-C to stop; -y skips this)...", end="", file=sys.stderr, flush=True)
    try:
        input()
    except (EOFError, KeyboardInterrupt):
        print(file=sys.stderr)
        return False
    return True


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
