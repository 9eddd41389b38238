"""specfleet logs: the journal of a host's replicas (or of its gateway), read-only.

    pyinfra inventory/ct200.py logs.py                                    # the last 100 lines of every unit
    pyinfra inventory/ct200.py logs.py --data replica=sglang@kimi_k26_dflash-gpu0-7 --data lines=500
    pyinfra inventory/ct200.py logs.py --data replica=smg --data follow=true   # the gateway's, as it comes

Each line is printed under its host's name, without the colours smg writes, its other control characters
written as escapes (a terminal shows them instead of acting on them). The journal holds no key: SGLang
logs its ServerArgs, api_key included, but its launcher masks the key in every line it copies to the
journal (operations/server/host_scripts/launch_sglang.py), and smg logs its configuration without its keys.
"""

from pyinfra import host, inventory, logger

from deployment import knobs
from operations import logs, status
from operations.basics import deploy_files, read_only

deploy_files.named_for_inspect(__file__)  # pyinfra's operation order, without a scan of every module per call

try:
    view = status.view_of(host, inventory)
    if view.problem:
        raise knobs.BadHostData(view.problem)
    lines = knobs.integer("lines", host.data.get("lines", logs.DEFAULT_LINES), minimum=1, maximum=logs.MOST_LINES)
    follow = knobs.boolean("follow", host.data.get("follow", False))
    units = logs.units(view, host.data.get("replica"))
except knobs.BadHostData as problem:
    logger.error(f"{host.print_prefix}logs.py: {problem}")
    units, failed = [], True
else:
    failed = False
if units:
    ok, _ = host.run_shell_command(logs.command(units, lines, follow), print_output=True,
                                   **read_only.connector_arguments(host))
    failed = not ok
if failed:
    host.state.failed_hosts.add(host)
if read_only.last_to_finish(host):
    raise SystemExit(1 if host.state.failed_hosts else 0)
