"""The bench's servers: a transient unit in each replica's place (its GPUs, port, user and confinement,
keyless on loopback), started per mode, and the deployed replicas started again after."""

import shlex

from deployment.server.config import Server
from operations.server import readiness, sandbox
from serving_benchmark import modes, remote
from serving_benchmark.remote import BENCH_UNIT


def bench_unit(server: Server, several: bool) -> str:
    """The transient unit standing in for a replica's unit: `specfleet-bench`, or with several replicas
    one for each, named after the replica (sglang@qwen36_ddtree-gpu3: specfleet-bench-qwen36_ddtree-gpu3)."""
    return f"{BENCH_UNIT}-{server.service_name.partition('@')[2]}" if several else BENCH_UNIT


def switching(unit: str) -> str:
    """Present while the sweep itself stops the bench unit (its ExecStopPost then leaves the deployed one)."""
    return f"/run/{unit}.switching"


def unit_environment(server: Server) -> dict[str, str]:
    """The deployed unit's environment (its GPUs included), less the key files: the bench server listens
    on loopback only, keyless (its /flush_cache too)."""
    return dict(sandbox.unit_environment(server, keyed=False))  # a name's last line wins, as in systemd


def bench_unit_command(d: Server, args: list[str], max_runtime_s: int, minors: tuple[int | None, ...],
                       unit: str = BENCH_UNIT, restores: tuple[str, ...] = ()) -> list[str]:
    """systemd-run's command line for the bench unit `unit` serving `args` in replica `d`'s place: the
    deployed unit's user and confinement (``sandbox.service_settings``, with the host's GPUs' `minors`), keyless: its environment (its
    GPUs) less the API key file, the configuration directory out of its reach; a time limit, and on stop (the limit, or the sweep's own stop) the deployed unit started again unless the
    sweep is switching modes (`restores`: the deployed units to start, by default `d`'s own; a tuner's
    layout takes other GPUs than theirs). ExecStopPost runs as root (+): the service user may not start a
    system unit."""
    restore = (f"+/bin/sh -c 'test -e {switching(unit)} || systemctl start --no-block "
               f"{' '.join(restores or (d.service_name,))}'")
    setenv = [f"--setenv={k}={v}" for k, v in unit_environment(d).items()]
    return ["systemd-run", f"--unit={unit}", "--collect",
            f"--description=specfleet serving benchmark of {d.service_name}",
            *(f"--property={setting}" for setting in (*sandbox.service_settings(d, minors),
                                                      *sandbox.keyless(d.engine.service))),
            f"--property=RuntimeMaxSec={max_runtime_s}", f"--property=ExecStopPost={restore}", *setenv,
            f"{d.engine.venv}/bin/python", f"{d.engine.service.install_dir}/bin/launch_sglang.py", *args]


def start_mode(host, replicas: tuple[Server, ...], mode: str, max_runtime_s: int,
               settings: dict | None = None) -> tuple[bool, str]:
    """Stop whatever serves (the deployed replicas or the previous mode) and start a bench unit with the
    mode's arguments in each replica's place (`settings`: the model's profiles' of the modes, modes.of_model)."""
    return start(host, replicas, replicas, [modes.mode_args(modes.as_served(d, mode, settings or {}), mode)
                                            for d in replicas], max_runtime_s)


def start(host, deployed: tuple[Server, ...], servers: tuple[Server, ...], args: list[list[str]], max_runtime_s: int,
          previous: tuple[str, ...] = ()) -> tuple[bool, str]:
    """Stop the `deployed` replicas and the bench units serving (theirs, and `previous`: a tuner's earlier
    layout), then start a bench unit serving each of `servers` with its `args`; each, once stopped by
    anything but this switch, starts every deployed replica again."""
    several = len(servers) > 1
    units = [bench_unit(d, several) for d in servers]
    stopped = list(dict.fromkeys([*units, *previous, *(bench_unit(d, len(deployed) > 1) for d in deployed)]))
    minors = sandbox.gpu_minor_numbers()
    restores = tuple(d.service_name for d in deployed)
    runs = [" ".join(shlex.quote(a) for a in bench_unit_command(d, a, max_runtime_s, minors, unit, restores)) + " 2>&1"
            for d, a, unit in zip(servers, args, units)]
    return remote.run(host, "; ".join([
        *(f"touch {switching(u)}" for u in stopped),
        f"systemctl stop {' '.join(d.service_name for d in deployed)} {' '.join(stopped)} 2>/dev/null",
        f"systemctl reset-failed {' '.join(units)} 2>/dev/null", f"rm -f {' '.join(switching(u) for u in stopped)}",
        " && ".join(runs)]))


def restore(host, replicas: tuple[Server, ...], remote_root: str, timeout_s: int,
            serving: tuple[str, ...] = ()) -> list[tuple[Server, dict]]:
    """Stop a client still running, the bench units (the replicas', and `serving`: a tuner's last layout's),
    and start the deployed replicas; wait until each generates. Per replica, its last probe."""
    several = len(replicas) > 1
    units = list(dict.fromkeys([*(bench_unit(r, several) for r in replicas), *serving]))
    remote.clean(host, replicas[0].engine.user, remote_root)
    remote.run(host, f"rm -f {' '.join(switching(u) for u in units)}; "
               f"systemctl stop {' '.join(units)} 2>/dev/null; systemctl start {' '.join(r.service_name for r in replicas)}")
    return [(r, readiness.watch(host, r, timeout_s, f"waiting for the deployed {r.service_name} to generate", 2.0)[0])
            for r in replicas]
