"""Runs ON THE HOST (imported by host_state.py): the answers to the shared basics' facts, each the
lines that fact's own shell command prints, so its process() reads them the same way.

    answer(args) -> list[str] | None   (None: this program cannot answer exactly; the controller
                                        then runs the fact's own command)
"""

import functools
import grp
import hashlib
import hmac
import json
import os
import pwd
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterable


# Each answer function's requests in this run (host_state.py fills it before it answers any), so that
# an answer reads at once what its siblings ask: one `systemctl show` for every unit of the run.
ASKED: dict[str, list[dict]] = {}
# The units an answer function ("module.function") reads, from its arguments: each module that reads
# units registers its functions, and `unit_states` shows all of them at once.
UNITS_READ: dict[str, Callable[[dict], Iterable[str]]] = {}


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


@functools.cache
def digest_key() -> bytes:
    """The run's digest key: the first line of stdin (file_states.DIGEST_KEY), read once, before any fork."""
    return sys.stdin.readline().strip().encode()


def digest(path: str) -> str:
    """FileStates' digest: HMAC-SHA256 under the run's key, which no log holds (file_states.digest_of)."""
    mac = hmac.new(digest_key(), digestmod=hashlib.sha256)
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            mac.update(block)
    return mac.hexdigest()


def name_of(uid_or_gid: int, lookup) -> str:
    try:
        return lookup(uid_or_gid)[0]
    except KeyError:
        return "UNKNOWN"  # what `stat -c %U` prints for an id without a name


def file_state(path: str) -> str:
    """FileStates' line: `[ -f ]`/`[ -d ]` follow a link, `stat` (no -L) does not."""
    if os.path.isfile(path) or os.path.isdir(path):
        st = os.lstat(path)
        owner = f"{oct(st.st_mode & 0o7777)[2:]}|{name_of(st.st_uid, pwd.getpwuid)}|{name_of(st.st_gid, grp.getgrgid)}"
        if os.path.isfile(path):
            return f"{path}|file|{owner}|{digest(path)}"
        return f"{path}|directory|{owner}|"
    return f"{path}|missing"


def file_states(args: dict) -> list[str]:
    return [file_state(path) for path in args["paths"]]


def user_file_states(args: dict) -> list[str] | None:
    """UserFileStates: FileStates read as the user (a forked child that became it, as runuser does).
    Forks: host_state.py runs it before any thread starts."""
    user, paths = args["user"], list(args["paths"])
    try:
        entry = pwd.getpwnam(user)
    except KeyError:
        return [f"{path}|missing" for path in paths]
    if os.geteuid() != 0:
        return None
    digest_key()  # read by this process: the child's read of stdin would be lost to it
    read_end, write_end = os.pipe()
    child = os.fork()
    if child == 0:
        try:
            os.close(read_end)
            os.initgroups(user, entry.pw_gid)
            os.setgid(entry.pw_gid)
            os.setuid(entry.pw_uid)
            os.write(write_end, json.dumps(file_states({"paths": paths})).encode())
        finally:
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as pipe:
        answer = pipe.read()
    os.waitpid(child, 0)
    return json.loads(answer) if answer else None


# The comment (GECOS) of each account the deploy made or took over (ownership.service_user): uninstall.py
# removes only accounts that carry it.
ACCOUNT_MARK = "specfleet"


def system_user(args: dict) -> list[str]:
    """SystemUser: home, whether it is a directory, the owner of its .cache (not followed), uid, shell, and
    whether its comment is the deploy's mark."""
    try:
        entry = pwd.getpwnam(args["user"])
    except KeyError:
        return []
    home = entry.pw_dir
    account = f"{entry.pw_uid} {entry.pw_shell or '-'} {'marked' if entry.pw_gecos == ACCOUNT_MARK else '-'}"
    if not os.path.isdir(home):
        return [f"{home} no - {account}"]
    try:
        owner = name_of(os.lstat(os.path.join(home, ".cache")).st_uid, pwd.getpwuid)
    except OSError:
        owner = "-"
    return [f"{home} yes {owner} {account}"]


def login_user(args: dict) -> list[str]:
    """LoginUser: the effective user, then the login behind sudo (empty without sudo)."""
    return [f"{name_of(os.geteuid(), pwd.getpwuid)} {os.environ.get('SUDO_USER', '')}"]


def linux_distribution(args: dict) -> list[str]:
    """pyinfra's LinuxDistribution: each /etc/*-release file (not a directory), its content, ---."""
    lines = []
    for name in sorted(n for n in os.listdir("/etc") if n.endswith("-release")):
        path = os.path.join("/etc", name)
        if os.path.exists(path) and not os.path.isdir(path):
            lines += [path, *read_lines(path), "---"]
    return lines


def arch(args: dict) -> list[str]:
    return [os.uname().machine]


@functools.cache
def units(names: tuple[str, ...]) -> dict[str, dict]:
    """`systemctl show` of units at once: is-active is ActiveState, is-enabled is UnitFileState
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


def unit_states(function: str, args: dict) -> dict[str, dict]:
    """The units FUNCTION reads with ARGS (UNITS_READ), from one `systemctl show` of every unit this run's
    answers read, whatever the number of replicas and of subjects asking."""
    asked = {name for known, requests in ASKED.items() if known in UNITS_READ
             for each in requests for name in UNITS_READ[known](each)}
    return units(tuple(sorted(asked | set(UNITS_READ[function](args)))))


def service_state(args: dict) -> list[str] | None:
    """ServiceState: the unit's and environment file's sha1, active and enabled state."""
    state = unit_states("host_facts.service_state", args).get(args["service"])
    if state is None:
        return None
    return [*(sha1(f) if os.path.isfile(f) else "-" for f in (args["unit_file"], args["env_file"])),
            state["ActiveState"], state["UnitFileState"] or "disabled"]


UNITS_READ["host_facts.service_state"] = lambda args: (args["service"],)


if __name__ == "__main__":  # FileStates' own command: its lines for the paths given
    print("\n".join(file_states({"paths": sys.argv[1:]})))
