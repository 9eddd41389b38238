"""The SGLang units, one a replica: each enabled, active, restarting, run by the service user, listening
where group_data says, with the arguments group_data asks for (deployment.server.command_line.server_args), on
the GPUs its layout gives it (nvidia-smi's processes of its cgroup); no other SGLang unit on the host."""

import ipaddress
import re
import shlex

import pytest

from deployment.server.command_line import server_args

# systemd's view of the unit, every process of its cgroup (user, socket inodes), the
# running main process's argv, the unit file's ExecStart, the TCP listeners on `port` and every TCP
# listener of the unit's processes.
_UNIT_SCRIPT = r"""
import json, os, pwd, socket, subprocess, sys
service, port = sys.argv[1], int(sys.argv[2])
names = "ActiveState,SubState,UnitFileState,User,Restart,MainPID,FragmentPath,ControlGroup,NeedDaemonReload"
shown = subprocess.run(["systemctl", "show", service, "-p", names], capture_output=True, text=True).stdout
props = dict(line.split("=", 1) for line in shown.splitlines() if "=" in line)
def user_of(pid):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("Uid:"):
            uid = int(line.split()[1])
            try:
                return pwd.getpwuid(uid).pw_name
            except KeyError:
                return str(uid)
processes = {}
group = props.get("ControlGroup") or "/nonexistent"
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        # Any cgroup hierarchy (v1, v2 or hybrid) placing the process in the unit's group.
        paths = [line.rstrip("\n").split(":", 2)[2] for line in open(f"/proc/{pid}/cgroup")]
        if not any(path == group or path.startswith(group + "/") for path in paths):
            continue
        inodes = []
        for fd in os.listdir(f"/proc/{pid}/fd"):
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
            if link.startswith("socket:["):
                inodes.append(link[8:-1])
        processes[pid] = {"user": user_of(pid), "sockets": inodes}
    except (OSError, IndexError):
        pass
main_pid = props.get("MainPID", "0")
try:
    argv = [a.decode(errors="replace") for a in open(f"/proc/{main_pid}/cmdline", "rb").read().split(b"\0")[:-1]]
except OSError:
    argv = None
exec_start = None
try:
    for line in open(props.get("FragmentPath") or "/nonexistent"):
        if line.startswith("ExecStart="):
            exec_start = line[len("ExecStart="):].strip()
except OSError:
    pass
def address(hex_address):
    raw = bytes.fromhex(hex_address)
    if len(raw) == 4:
        return socket.inet_ntop(socket.AF_INET, raw[::-1])
    return socket.inet_ntop(socket.AF_INET6, b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4)))
listeners = []
for table in ("/proc/net/tcp", "/proc/net/tcp6"):
    try:
        lines = open(table).read().splitlines()[1:]
    except OSError:
        continue
    for line in lines:
        fields = line.split()
        local, state, inode = fields[1], fields[3], fields[9]
        hex_address, hex_port = local.split(":")
        if state != "0A":
            continue
        owners = [pid for pid, p in processes.items() if inode in p["sockets"]]
        if int(hex_port, 16) == port or owners:
            listeners.append({"address": address(hex_address), "port": int(hex_port, 16), "unit_pids": owners})
print(json.dumps({"props": props, "processes": {pid: p["user"] for pid, p in processes.items()},
                  "argv": argv, "exec_start": exec_start,
                  "listeners": [l for l in listeners if l["port"] == port],
                  "unit_listeners": [l for l in listeners if l["unit_pids"]]}))
"""


def unit_state(target, replica) -> dict:
    return target.memo(f"unit {replica.service_name}",
                       lambda: target.python(_UNIT_SCRIPT, replica.service_name, str(replica.port)))


def each_replica(target, check) -> None:
    """Run `check(replica, its unit state)` on every replica; fail with every replica's problem."""
    problems = [problem for replica in target.replicas for problem in check(replica, unit_state(target, replica))]
    assert not problems, "\n".join(problems)


def expected_command(d) -> list[str]:
    """The ExecStart of templates/server/sglang.service.j2: the launcher and server_args(server)."""
    return [f"{d.engine.venv}/bin/python", f"{d.engine.service.install_dir}/bin/launch_sglang.py", *server_args(d)]


def flags(args: list[str]) -> dict[str, list[str]]:
    """`--flag v1 v2 --switch` -> {"--flag": ["v1", "v2"], "--switch": []}; leading words under ""."""
    parsed: dict[str, list[str]] = {"": []}
    current = ""
    for arg in args:
        if arg.startswith("--"):
            current = arg
            parsed.setdefault(current, [])
        else:
            parsed[current].append(arg)
    return parsed


def args_differences(expected: list[str], found: list[str]) -> list[str]:
    want, got = flags(expected), flags(found)
    differences = []
    if want.pop("") != got.pop(""):
        differences.append(f"command: expected {shlex.join(expected[:2])}, found {shlex.join(found[:2])}")
    for flag in sorted(set(want) | set(got)):
        if flag not in got:
            differences.append(f"{flag}: expected {' '.join(want[flag]) or '(set)'}, found it missing")
        elif flag not in want:
            differences.append(f"{flag}: expected no such flag, found {' '.join(got[flag]) or '(set)'}")
        elif want[flag] != got[flag]:
            differences.append(f"{flag}: expected {' '.join(want[flag])}, found {' '.join(got[flag])}")
    return differences


def test_unit_is_enabled_and_active(target):
    def check(d, unit):
        props = unit["props"]
        state = (props.get("UnitFileState"), props.get("ActiveState"), props.get("SubState"))
        return [] if state == ("enabled", "active", "running") else [
            f"{target.name}: expected {d.service_name} enabled/active/running, found {'/'.join(map(str, state))}: "
            f"check `journalctl -u {d.service_name}`"]
    each_replica(target, check)


def test_unit_runs_as_the_service_user(target):
    """As its deployment's user: the host's service user, or on a host of several deployments each one's own."""
    def check(d, unit):
        problems = []
        if unit["props"].get("User") != d.engine.user:
            problems.append(f"{target.name}: expected {d.service_name}'s User={d.engine.user}, found "
                            f"User={unit['props'].get('User')}")
        others = {pid: user for pid, user in unit["processes"].items() if user != d.engine.user}
        if not unit["processes"] or others:
            problems.append(f"{target.name}: expected every process of {d.service_name} run by {d.engine.user}, "
                            "found " + (", ".join(f"process {pid} run by {user}" for pid, user in others.items())
                                        or "no processes"))
        return problems
    each_replica(target, check)


def test_unit_has_a_restart_policy(target):
    def check(d, unit):
        restart = unit["props"].get("Restart")
        return [] if restart not in (None, "", "no") else [
            f"{target.name}: expected {d.service_name} to restart when it dies (Restart=always or on-failure), "
            f"found Restart={restart}"]
    each_replica(target, check)


def test_unit_listens_on_the_configured_address_and_port(target):
    if not target.serves_http:
        pytest.skip("rank >= 1 of a node group serves no model (tests/deployed/test_multinode.py)")

    def check(d, unit):
        wanted = ipaddress.ip_address(d.engine.service.bind_address)
        listeners = unit["listeners"]
        ours = [l for l in listeners if ipaddress.ip_address(l["address"]) == wanted and l["unit_pids"]]
        found = ", ".join(f"{l['address']}:{l['port']} ({'pids ' + ' '.join(l['unit_pids']) if l['unit_pids'] else 'not ' + d.service_name})"
                          for l in listeners) or "nothing listening on that port"
        return [] if ours else [f"{target.name}: expected {d.service_name} listening on {d.engine.service.bind_address}:{d.port}, "
                                f"found {found}"]
    each_replica(target, check)


def store_port(d) -> int:
    """Where torch.distributed's TCPStore of this replica listens: its --nccl-port alone on a node, a node
    group's dist-init port on its rank 0 (SGLang 0.5.23 srt/distributed/bootstrap.py)."""
    args = list(d.engine.node_args)
    return int(args[args.index("--dist-init-addr") + 1].rpartition(":")[2]) if "--dist-init-addr" in args \
        else d.nccl_port


def test_every_listener_of_a_replica_is_on_loopback_or_its_bind_address(target):
    """Every TCP listener of every process of the unit (HTTP, each scheduler's Gloo device, NCCL's
    bootstrap), by its cgroup: on loopback or the bind address (an unspecified one: any address). One
    exception, pinned here as the engine has it: torch's TCPStore (torch 2.14.1, which SGLang 0.5.23 pins)
    listens on every address whatever --host says, on the replica's own --nccl-port (the layout's: SGLang
    draws none of its own) or a node group's dist-init port; nothing else may."""
    def check(d, unit):
        bind = ipaddress.ip_address(d.engine.service.bind_address)
        problems = []
        for listener in unit["unit_listeners"]:
            address = ipaddress.ip_address(listener["address"])
            if address.is_loopback or address == bind or (bind.is_unspecified and address.is_unspecified):
                continue
            if address.is_unspecified and listener["port"] == store_port(d):
                continue
            problems.append(f"{target.name}: {d.service_name} listens on {listener['address']}:{listener['port']} "
                            f"(pids {' '.join(listener['unit_pids'])}), beyond loopback and its bind address "
                            f"{d.engine.service.bind_address}")
        on_store = [l for l in unit["unit_listeners"] if l["port"] == store_port(d)]
        if target.serves_http and not on_store:
            problems.append(f"{target.name}: expected {d.service_name}'s TCPStore on port {store_port(d)}, found "
                            f"its listeners on {', '.join(str(l['port']) for l in unit['unit_listeners']) or 'none'}")
        return problems
    each_replica(target, check)


def test_unit_arguments_are_what_group_data_asks_for(target):
    """Speculative algorithm, draft model, draft tokens or DDTree budget, TP size, attention backends..."""
    def check(d, unit):
        expected = expected_command(d)
        if not unit["argv"]:
            return [f"{target.name}: expected {d.service_name}'s main process, found none running"]
        problems = []
        running = args_differences(expected, unit["argv"])
        if running:
            problems += [f"{target.name}: {d.service_name} runs with other arguments than group_data asks for "
                         f"({d.engine.profile_name} on {d.engine.host_class}):", *running]
        on_disk = args_differences(expected, shlex.split(unit["exec_start"] or ""))
        if on_disk:
            problems += [f"{target.name}: {d.unit_file} has other arguments than group_data asks for:", *on_disk]
        if unit["props"].get("NeedDaemonReload") != "no":
            problems.append(f"{target.name}: expected systemd to have loaded {d.unit_file} as it is on disk, found "
                            "it changed since (NeedDaemonReload=yes)")
        return problems
    each_replica(target, check)


# Per unit: the GPUs (PCI bus ids) nvidia-smi says processes of its cgroup hold, and its environment file's
# CUDA_VISIBLE_DEVICES; the host's GPUs by index.
_GPUS_SCRIPT = r"""
import json, os, subprocess, sys
def csv(*args):
    out = subprocess.run(["nvidia-smi", *args, "--format=csv,noheader"], capture_output=True, text=True).stdout
    return [[cell.strip() for cell in line.split(",")] for line in out.splitlines() if line.strip()]
bus = {row[1].upper(): int(row[0]) for row in csv("--query-gpu=index,pci.bus_id")}
apps = {int(row[0]): bus.get(row[1].upper()) for row in csv("--query-compute-apps=pid,gpu_bus_id")}
result = {}
for unit, env_file in zip(sys.argv[1::2], sys.argv[2::2]):
    group = subprocess.run(["systemctl", "show", "-p", "ControlGroup", "--value", unit], capture_output=True,
                           text=True).stdout.strip() or "/nonexistent"
    pids = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:  # any cgroup hierarchy (v1, v2 or hybrid) placing the process in the unit's group
            paths = [line.rstrip("\n").split(":", 2)[2] for line in open(f"/proc/{pid}/cgroup")]
        except (OSError, IndexError):
            continue
        if any(path == group or path.startswith(group + "/") for path in paths):
            pids.append(int(pid))
    try:
        lines = open(env_file).read().splitlines()
    except OSError:
        lines = []
    visible = next((line.split("=", 1)[1].strip() for line in lines if line.startswith("CUDA_VISIBLE_DEVICES=")), None)
    result[unit] = {"gpus": sorted({apps[p] for p in pids if p in apps}), "visible": visible}
print(json.dumps(result))
"""


def test_each_replica_holds_the_gpus_its_layout_gives_it_and_no_two_share_one(target):
    """nvidia-smi's compute processes of each unit's cgroup are on its layout's GPUs (CUDA_VISIBLE_DEVICES in
    its environment file, in the layout's order), every one of them; no GPU is held by two units."""
    replicas = target.replicas  # a rank >= 1 of a node group holds its GPUs too
    found = target.python(_GPUS_SCRIPT, *(part for r in replicas for part in (r.service_name, r.env_file)))
    problems, holders = [], {}
    for r in replicas:
        state = found[r.service_name]
        if state["visible"] != ",".join(map(str, r.gpus)):
            problems.append(f"{target.name}: expected CUDA_VISIBLE_DEVICES={','.join(map(str, r.gpus))} in {r.env_file}, "
                            f"found {state['visible']}")
        if state["gpus"] != sorted(r.gpus):
            problems.append(f"{target.name}: expected {r.service_name}'s processes on GPUs {sorted(r.gpus)} "
                            f"(nvidia-smi --query-compute-apps), found them on {state['gpus']}")
        for gpu in state["gpus"]:
            holders.setdefault(gpu, []).append(r.service_name)
    problems += [f"{target.name}: expected GPU {gpu} held by one unit, found {', '.join(units)}"
                 for gpu, units in holders.items() if len(units) > 1]
    assert not problems, "\n".join(problems)


def test_the_host_runs_no_sglang_unit_its_deployments_do_not_want(target):
    """An earlier layout's single unit (PREFIX.service), another profile's or layout's replicas: retired."""
    from operations.server.unit import ServerUnits
    prefix = target.deployment.host.service.service_prefix
    units = target.facts(units=(ServerUnits(), dict(prefix=prefix)))["units"] or {}
    wanted = {r.service_name for r in target.replicas}
    assert set(units) == wanted, (f"{target.name}: expected exactly the SGLang units {sorted(wanted)}, found "
                                  f"{sorted(units)}")
    running = target.run(f"systemctl list-units --no-legend --plain --state=active {shlex.quote(prefix)}.service "
                         f"{shlex.quote(prefix + '@*')}.service").stdout.split("\n")
    active = {line.split()[0].removesuffix(".service") for line in running if line.strip()}
    assert active == wanted, f"{target.name}: expected {sorted(wanted)} active, found {sorted(active)}"


MAX_EXPOSURE = 3.0  # systemd-analyze security's scale: 10 is unconfined, 0 fully locked down


def exposure(target, unit: str) -> float | None:
    out = target.run(f"systemd-analyze security --no-pager {shlex.quote(unit)}").stdout
    last = out.strip().splitlines()[-1] if out.strip() else ""
    return float(last.split(":", 1)[1].split()[0]) if "Overall exposure level" in last else None


def loose_units(target, units) -> str | None:
    """Why some of `units` are rated above MAX_EXPOSURE, or None."""
    scores = {unit: exposure(target, unit) for unit in units}
    loose = {unit: score for unit, score in scores.items() if score is None or score > MAX_EXPOSURE}
    return (f"{target.name}: expected `systemd-analyze security` to rate each unit at most {MAX_EXPOSURE}, found "
            + ", ".join(f"{unit} {score}" for unit, score in loose.items())) if loose else None


def test_units_are_confined(target):
    """Every SGLang unit and every weights unit on the host: NoNewPrivileges, ProtectSystem=strict, no
    capabilities... A weights unit is written when its repo has something to fetch: a host whose weights
    were already complete when it was deployed (kept by uninstall.py, say) has none to rate."""
    weights = [f"{repo.unit_name}.service" for d in target.deployments for repo in d.weights.repos]
    present = target.run("cd /etc/systemd/system && ls -1 -- " + " ".join(map(shlex.quote, weights))
                         + " 2>/dev/null").stdout.split()
    units = dict.fromkeys([*(r.service_name for r in target.replicas), *(u for u in weights if u in present)])
    loose = loose_units(target, units)
    assert not loose, loose


SPAN_UNITS = {"h": 3600, "min": 60, "s": 1, "ms": 0.001, "us": 0.000001}


def timespan_s(text: str) -> float | None:
    """systemd's timespan as `systemctl show` prints it ("15min 30s") in seconds; None if not one."""
    parts = re.findall(r"(\d+)(h|min|ms|us|s)\b", text)
    return sum(int(n) * SPAN_UNITS[unit] for n, unit in parts) if parts else None


def test_a_stop_drains_the_server_through_its_main_process(target):
    """KillMode=mixed (SIGTERM to the main process alone: SGLang's schedulers have no handler) and a stop
    timeout past the longest generation; the download user's home (the HF token's) out of the server's reach."""
    def check(d, _):
        shown = target.run(f"systemctl show {shlex.quote(d.service_name)} -p KillMode,TimeoutStopUSec,"
                           "InaccessiblePaths").stdout
        props = dict(line.split("=", 1) for line in shown.splitlines() if "=" in line)
        found, wanted = (props.get("KillMode"), timespan_s(props.get("TimeoutStopUSec", ""))), ("mixed" if d.engine.drains_on_stop else "control-group", d.engine.service.stop_timeout_s)
        problems = [] if found == wanted else [
            f"{target.name}: expected {d.service_name} KillMode/TimeoutStopUSec {wanted}, found {found}"]
        if d.engine.service.download_home not in (path.lstrip("-") for path in props.get("InaccessiblePaths", "").split()):
            problems.append(f"{target.name}: expected {d.engine.service.download_home} (the HF token's home) inaccessible to "
                            f"{d.service_name}, found InaccessiblePaths={props.get('InaccessiblePaths')}")
        return problems
    each_replica(target, check)


# Each path: owner, and whether a user other than root can write it (group or other write bit
# with a non-root group, or other write), without following links.
_OWNERS_SCRIPT = r"""
import json, os, pwd, grp, stat, sys
result = {}
for path in sys.argv[1:]:
    try:
        st = os.lstat(path)
    except OSError:
        continue
    group = grp.getgrgid(st.st_gid).gr_name
    writable = bool(st.st_mode & stat.S_IWOTH) or (bool(st.st_mode & stat.S_IWGRP) and group != "root")
    result[path] = {"owner": pwd.getpwuid(st.st_uid).pw_name, "link": stat.S_ISLNK(st.st_mode), "writable": writable}
print(json.dumps(result))
"""


def test_what_root_writes_or_runs_is_roots_alone(target):
    """Root's directories and files (config, install, host scripts, units, the API key) are root's and
    writable by root only; each deployment's user's cache is that user's."""
    d = target.deployment.replicas[0]
    scripts = target.run(f"ls {shlex.quote(d.engine.service.install_dir)}/bin").stdout.split()
    paths = [d.engine.service.config_dir, d.engine.service.api_key_file, d.engine.service.install_dir, f"{d.engine.service.install_dir}/bin",
             *(path for r in target.replicas for path in (r.env_file, r.unit_file)),
             *(f"{d.engine.service.install_dir}/bin/{name}" for name in scripts),
             *(f"{d.engine.service.config_dir}/{repo.spec_file_name}" for dep in target.deployments for repo in dep.weights.repos)]
    caches = {f"{dep.engine.home}/.cache": dep.engine.user for dep in target.deployments}
    found = target.python(_OWNERS_SCRIPT, *paths, *caches)
    owned = {path: found.pop(path, None) for path in caches}
    wrong = [f"{path} ({'a link, ' if f['link'] else ''}owner {f['owner']}{', writable by others' if f['writable'] else ''})"
             for path, f in found.items() if f["owner"] != "root" or f["writable"] or f["link"]]
    assert not wrong, f"{target.name}: expected root's paths owned and writable by root alone, found " + "; ".join(wrong)
    for path, user in caches.items():
        cache = owned[path]
        assert cache and cache["owner"] == user and not cache["link"] and not cache["writable"], (
            f"{target.name}: expected {path} to be {user}'s directory, writable by it alone, found {cache}")
