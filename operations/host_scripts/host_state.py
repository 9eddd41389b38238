"""Runs ON THE HOST (sent inline, as root: it only reads): the whole state a deploy compares against,
in one Python start.

Usage: host_state.py REQUESTS, where REQUESTS is JSON [[fact name, {argument: value}], ...]: the
facts the deploy's operations read (operations/host_state.py lists them). For each it prints the
lines that fact's own shell command prints (or lines its process() reads the same way), so each
fact's process() parses them as before; null where this program cannot answer exactly (the
controller then runs that fact's own command). Prints one JSON list, in the order asked:

    [["root "], ["0, NVIDIA B200, 183359, 10.0, 580.95.05, Enabled, Disabled", ...], null, ...]

One nvidia-smi run per kind of output (--query-gpu, topo -m, -q), shared by every GPU fact and
run side by side; one dpkg-query and one `systemctl show` for all packages and units; the
readiness probe runs meanwhile in a thread. Venv versions come from the dist-info METADATA in
the venv's site-packages, as importlib.metadata reads it, without starting the venv's Python.
"""

import contextlib
import fnmatch
import grp
import hashlib
import io
import json
import os
import pwd
import re
import shutil
import subprocess
import sys
import threading

import probe_server
import weights_disk
import weights_state

GPU_QUERY = ("--query-gpu=index,name,memory.total,compute_cap,driver_version,persistence_mode,mig.mode.current",
             "--format=csv,noheader,nounits")
FABRIC_PACKAGES = ("nvidia-fabricmanager*", "nvlsm")
NVIDIA_PACKAGES = ("nvidia-*", "libnvidia-*", "nvlsm", "cuda-keyring", "linux-headers-*")
FABRIC_UNITS = ("nvidia-fabricmanager", "nvidia-persistenced")


def run(argv: list[str], merge_stderr: bool = True) -> subprocess.Popen:
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT if merge_stderr else
                            subprocess.DEVNULL, stdin=subprocess.DEVNULL, text=True, errors="replace")


def lines_of(process: subprocess.Popen | None) -> list[str]:
    return [] if process is None else process.communicate()[0].splitlines()


def read_lines(path: str) -> list[str]:
    try:
        with open(path, errors="replace") as f:
            return f.read().splitlines()
    except OSError:
        return []


def sha1(path: str) -> str:
    digest = hashlib.sha1()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def name_of(uid_or_gid: int, lookup) -> str:
    try:
        return lookup(uid_or_gid)[0]
    except KeyError:
        return "UNKNOWN"  # what `stat -c %U` prints for an id without a name


def file_state(path: str) -> str:
    """filestate.FileStates' line: `[ -f ]`/`[ -d ]` follow a link, `stat` (no -L) does not."""
    if os.path.isfile(path) or os.path.isdir(path):
        st = os.lstat(path)
        owner = f"{oct(st.st_mode & 0o7777)[2:]}|{name_of(st.st_uid, pwd.getpwuid)}|{name_of(st.st_gid, grp.getgrgid)}"
        if os.path.isfile(path):
            return f"{path}|file|{owner}|{sha1(path)}"
        return f"{path}|directory|{owner}|"
    return f"{path}|missing"


def file_states(paths: list[str]) -> list[str]:
    return [file_state(path) for path in paths]


def user_file_states(user: str, paths: list[str]) -> list[str] | None:
    """secrets.UserFileStates: FileStates read as USER (a forked child that became USER, as runuser does)."""
    try:
        entry = pwd.getpwnam(user)
    except KeyError:
        return [f"{path}|missing" for path in paths]
    if os.geteuid() != 0:
        return None
    read_end, write_end = os.pipe()
    child = os.fork()
    if child == 0:
        try:
            os.close(read_end)
            os.initgroups(user, entry.pw_gid)
            os.setgid(entry.pw_gid)
            os.setuid(entry.pw_uid)
            os.write(write_end, json.dumps(file_states(paths)).encode())
        finally:
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as pipe:
        answer = pipe.read()
    os.waitpid(child, 0)
    return json.loads(answer) if answer else None


def system_user(user: str) -> list[str]:
    """layout.SystemUser: home, whether it is a directory, the owner of its .cache (not followed)."""
    try:
        home = pwd.getpwnam(user).pw_dir
    except KeyError:
        return []
    if not os.path.isdir(home):
        return [f"{home} no -"]
    try:
        owner = name_of(os.lstat(os.path.join(home, ".cache")).st_uid, pwd.getpwuid)
    except OSError:
        owner = "-"
    return [f"{home} yes {owner}"]


def normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


def venv_requirement(path: str, distribution: str, marker: str) -> list[str] | None:
    """venv.VenvRequirement: the distribution's version (METADATA in the site-packages of the Python
    the venv's bin/python is) and the marker's lines; nothing when bin/python is not executable."""
    python = os.path.join(path, "bin", "python")
    if not os.access(python, os.X_OK):
        return []
    version = re.fullmatch(r"python(\d+\.\d+)", os.path.basename(os.path.realpath(python)))
    if not version:
        return None  # which site-packages that Python reads is not known without starting it
    site = os.path.join(path, "lib", f"python{version.group(1)}", "site-packages")
    found = ""
    try:
        entries = sorted(os.listdir(site))
    except OSError:
        entries = []
    for entry in entries:
        stem = entry[:-len(".dist-info")] if entry.endswith(".dist-info") else None
        if stem and normalized(stem.split("-")[0]) == normalized(distribution):
            for line in read_lines(os.path.join(site, entry, "METADATA")):
                if line.startswith("Version:"):
                    found = line.split(":", 1)[1].strip()
                    break
                if not line:
                    break
            break
    return [found, *(read_lines(os.path.join(path, marker)) or [""])]


def linux_distribution() -> list[str]:
    """pyinfra's LinuxDistribution: each /etc/*-release file (not a directory), its content, ---."""
    lines = []
    for name in sorted(n for n in os.listdir("/etc") if n.endswith("-release")):
        path = os.path.join("/etc", name)
        if os.path.exists(path) and not os.path.isdir(path):
            lines += [path, *read_lines(path), "---"]
    return lines


def units(names: list[str]) -> dict[str, dict]:
    """`systemctl show` of every unit at once: is-active is ActiveState, is-enabled is UnitFileState
    (empty where systemctl is-enabled prints nothing: no such unit file). A unit systemd did not
    show (no systemd running) is left out."""
    if not names or not shutil.which("systemctl"):
        return {}
    full = [name if "." in name else f"{name}.service" for name in names]
    output = lines_of(run(["systemctl", "show", "-p", "Id,ActiveState,UnitFileState", "--", *full],
                          merge_stderr=False))
    shown, current = {}, {}
    for line in [*output, ""]:
        if not line:
            if current.get("Id"):
                shown[current["Id"]] = current
            current = {}
        else:
            key, _, value = line.partition("=")
            current[key] = value
    return {name: shown[unit] for name, unit in zip(names, full) if unit in shown}


def nvidia_fabric(nvswitch_dir: str, unit_states: dict, packages: list[tuple[str, str, str, str]],
                  q_lines: list[str]) -> list[str]:
    """gpu.facts.NvidiaFabric's lines, from the shared unit states, packages and `nvidia-smi -q`."""
    lines = ["nvswitch: present" if os.path.isdir(nvswitch_dir) and os.listdir(nvswitch_dir) else "nvswitch: absent"]
    for unit in FABRIC_UNITS:
        state = unit_states.get(unit, {})
        lines.append(f"unit: {unit} enabled={state.get('UnitFileState', '')} active={state.get('ActiveState', '')}")
    if os.path.isdir("/sys/module/ib_umad"):
        lines.append("ib_umad: loaded")
    lines += [f"package: {name} {version} {status}" for _, status, name, version in packages
              if any(fnmatch.fnmatchcase(name, pattern) for pattern in FABRIC_PACKAGES)]
    # The awk filter of NvidiaFabric's command: GPU headers and each GPU's Fabric section.
    fabric = False
    for line in q_lines:
        if line.startswith("GPU "):
            lines.append(line)
        elif line == "    Fabric":
            fabric = True
            lines.append(line)
        elif fabric and re.match(r"^        [A-Za-z]", line):
            lines.append(line)
        else:
            fabric = False
    return lines


def probe(arguments: dict) -> list[str]:
    """readiness.ServerProbe: probe_server.py's output."""
    printed = io.StringIO()
    try:
        with contextlib.redirect_stdout(printed):
            probe_server.main(str(arguments["port"]), arguments["model"], arguments["key_file"],
                              arguments["service_user"])
    except Exception as error:  # as the script's own traceback would end its output
        printed.write(f"{type(error).__name__}: {error}\n")
    return printed.getvalue().splitlines()


class Shared:
    """What several facts are read from, each run once: nvidia-smi's three outputs (side by side),
    the packages, the units, the probe (in a thread) and the service user's files (a forked child)."""

    def __init__(self, requests: list):
        names = {name for name, _ in requests}
        # Forked before any thread starts.
        self.user_files = {i: user_file_states(args["user"], list(args["paths"]))
                           for i, (name, args) in enumerate(requests) if name == "UserFileStates"}
        self.probes: dict = {}
        self.threads = [threading.Thread(target=lambda i=i, args=args: self.probes.__setitem__(i, probe(args)))
                        for i, (name, args) in enumerate(requests) if name == "ServerProbe"]
        for thread in self.threads:
            thread.start()
        gpu = {"NvidiaGpus", "NvidiaTopology", "NvidiaDriver", "RebootPending", "NvidiaFabric"}
        self.smi = shutil.which("nvidia-smi") if names & gpu else None
        query, topo, q = ((run([self.smi, *argv]) if self.smi else None)
                          for argv in (GPU_QUERY, ("topo", "-m"), ("-q",)))
        dpkg = None
        if names & {"NvidiaFabric", "NvidiaPackages"} and shutil.which("dpkg-query"):
            dpkg = run(["dpkg-query", "-W", "-f=${db:Status-Abbrev}|${db:Status-Status}|${Package}|${Version}\\n",
                        *sorted(set(FABRIC_PACKAGES + NVIDIA_PACKAGES))], merge_stderr=False)
        self.units = units([*(FABRIC_UNITS if "NvidiaFabric" in names else ()),
                            *(args["service"] for name, args in requests if name == "ServiceState")])
        self.query, self.topo, self.q = lines_of(query), lines_of(topo), lines_of(q)
        self.packages = [tuple(line.split("|", 3)) for line in lines_of(dpkg) if line.count("|") >= 3]

    def done(self) -> dict:
        for thread in self.threads:
            thread.join()
        return self.probes


def login_user(args: dict, shared: Shared) -> list[str]:
    sudo_user = os.environ.get("SUDO_USER")
    return [f"{sudo_user or name_of(os.geteuid(), pwd.getpwuid)} {'sudo' if sudo_user else ''}"]


def reboot_pending(args: dict, shared: Shared) -> list[str]:
    # nvidia-smi fails every query alike when driver and library differ: the query's output says so.
    return ((["/var/run/reboot-required exists"] if os.path.exists("/var/run/reboot-required") else [])
            + [line.strip() for line in shared.query if "version mismatch" in line.lower()])


def service_state(args: dict, shared: Shared) -> list[str] | None:
    state = shared.units.get(args["service"])
    if state is None:
        return None
    return [*(sha1(f) if os.path.isfile(f) else "-" for f in (args["unit_file"], args["env_file"])),
            state["ActiveState"], state["UnitFileState"] or "disabled"]


def host_python(uv: str, minimum: list[int], source: str) -> list[str]:
    """venv.HostPython: the machine, this python3 (the one the fact's command starts) and, where it is
    older than `minimum`, whether `source` answers at all; `uv --version`."""
    import urllib.error
    import urllib.request
    version = "%d.%d.%d" % sys.version_info[:3]
    reach = "-"
    if sys.version_info < tuple(minimum):
        try:
            urllib.request.urlopen(source, timeout=5)
            reach = "reached"
        except urllib.error.HTTPError:  # an answer, whatever its status: the source is reachable
            reach = "reached"
        except Exception:
            reach = "unreachable"
    try:
        run = subprocess.run([uv, "--version"], capture_output=True, text=True, timeout=30)
        uv_line = run.stdout.strip() if run.returncode == 0 and run.stdout.strip() else "uv none"
    except OSError:
        uv_line = "uv none"
    return [f"machine {os.uname().machine}", f"python {version} {reach}", uv_line]


ANSWERS = {
    "LoginUser": login_user,
    "NvidiaGpus": lambda args, shared: shared.query,
    "NvidiaTopology": lambda args, shared: shared.topo,
    "NvidiaDriver": lambda args, shared: read_lines("/proc/driver/nvidia/version") + shared.q,
    "RebootPending": reboot_pending,
    "NvidiaFabric": lambda args, shared: nvidia_fabric("/proc/driver/nvidia-nvswitch/devices", shared.units,
                                                       shared.packages, shared.q),
    "NvidiaPackages": lambda args, shared: [f"{abbrev} {name} {version}"
                                            for abbrev, _, name, version in shared.packages],
    "LinuxDistribution": lambda args, shared: linux_distribution(),
    "Arch": lambda args, shared: [os.uname().machine],
    "FileStates": lambda args, shared: file_states(list(args["paths"])),
    "SystemUser": lambda args, shared: system_user(args["user"]),
    "HostPython": lambda args, shared: host_python(args["uv"], args["minimum"], args["source"]),
    "VenvRequirement": lambda args, shared: venv_requirement(args["path"], args["distribution"], args["marker"]),
    "GpuSmokeRecord": lambda args, shared: (read_lines("/proc/sys/kernel/random/boot_id")
                                            + read_lines(args["path"])),
    "WeightsDisk": lambda args, shared: [json.dumps({d: weights_disk.disk(d) for d in args["local_dirs"]})],
    "WeightsState": lambda args, shared: [json.dumps(weights_state.main(json.loads(args["listings"])))],
    "ServiceState": service_state,
}


def main(requests: list) -> list:
    shared = Shared(requests)
    answers = []
    for i, (name, args) in enumerate(requests):
        try:
            answers.append(shared.user_files[i] if name == "UserFileStates" else
                           ANSWERS[name](args, shared) if name in ANSWERS else None)
        except OSError:  # unreadable here: the fact's own command says what it says
            answers.append(None)
    for i, lines in shared.done().items():
        answers[i] = lines
    return answers


if __name__ == "__main__":
    print(json.dumps(main(json.loads(sys.argv[1]))))
