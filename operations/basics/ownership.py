"""Who owns what on a host: the service user and its cache, root's directories.

The service user owns its home and cache (where the server and the downloads write); every
directory root writes in or executes from (install and config directories) is root's and
not writable by the service user, so no link it plants can redirect what root does.
"""

import shlex
from pathlib import Path

from pyinfra import host
from pyinfra.api import FactBase, QuoteString, StringCommand, operation
from pyinfra.operations import files, server

from operations.basics import gathering, host_programs, shell
from operations.basics.failing import fail_host
from operations.basics.file_states import FileStates, matches
from operations.basics.host_scripts.host_facts import ACCOUNT_MARK


class SystemUser(FactBase):
    """
    A user's home directory, whether it exists, the owner of its `.cache` (not following a link
    there; None if absent), its uid and login shell (None if empty), and whether its comment is the
    deploy's mark (ACCOUNT_MARK); None when there is no such user.

    .. code:: python

        {"home": "/home/sglang", "home_exists": True, "cache_owner": "sglang", "uid": 998,
         "shell": "/usr/sbin/nologin", "marked": True}
    """

    def command(self, user: str) -> str:
        return (f"getent passwd {shlex.quote(user)} | while IFS=: read -r _ _ uid _ gecos home shell; do "
                f'mark=-; [ "$gecos" = {ACCOUNT_MARK} ] && mark=marked; '
                'if [ -d "$home" ]; then echo "$home yes $(stat -c %U "$home/.cache" 2>/dev/null || echo -) '
                '$uid ${shell:--} $mark"; else echo "$home no - $uid ${shell:--} $mark"; fi; done')

    host_answer = "host_facts.system_user"

    def process(self, output):
        home, exists, cache_owner, uid, shell, mark = output[0].rsplit(" ", 5)
        return {"home": home, "home_exists": exists == "yes", "cache_owner": None if cache_owner == "-" else cache_owner,
                "uid": int(uid), "shell": None if shell == "-" else shell, "marked": mark == "marked"}


DIRECTORY_MARK = ".specfleet"  # ``mark_of``
MARK_TEXT = "made by specfleet's deploy: uninstall.py removes this directory whole"

# The uids useradd gives system users on Debian and Ubuntu (/etc/login.defs SYS_UID_MAX 999); a login
# account has a higher one.
SYSTEM_UIDS = range(1, 1000)
NO_LOGIN_SHELLS = ("/usr/sbin/nologin", "/sbin/nologin", "/bin/false", "/usr/bin/false")


def account_problem(user: str, home: str, existing: dict | None) -> str | None:
    """Why the existing account `user` is not a service user the deploy may own (create, give no login
    shell, run a service as): it is root, a login account, or another service's; None when it may
    (absent, or a system user without a login shell whose home is `home`, as the deploy creates it)."""
    if not existing:
        return None
    if existing["uid"] == 0:
        why = "has uid 0 (root's privileges)"
    elif existing["uid"] not in SYSTEM_UIDS:
        why = f"is a login account (uid {existing['uid']}, not a system user's below {SYSTEM_UIDS.stop})"
    elif existing["shell"] not in NO_LOGIN_SHELLS:
        why = f"has the login shell {existing['shell'] or '/bin/sh'}"
    elif existing["home"] != home:
        why = f"has the home {existing['home']}, not {home}: it belongs to something else"
    else:
        return None
    return (f"the account {user} {why}; the deploy would take it over (no login shell, a service running as it): "
            "name a user of the service's own, which the deploy creates")


def _own_cache(user: str, home: str) -> StringCommand:
    """The user's `.cache`, made by the user itself in its own home: the confined units name it writable
    (ReadWritePaths), and systemd refuses to start a unit whose writable path is missing (226/NAMESPACE)."""
    return StringCommand("runuser", "-u", user, "--", "mkdir", "-p", "-m", "700", QuoteString(f"{home}/.cache"))


@operation()
def service_user(user: str, home: str, group: str | None = None):
    """
    The service's system user, with its home (where HF_HOME lives), no login shell, and its own `.cache`;
    created in the supplementary `group` if given (what that group reads, this user reads).

    One fact in the usual case where it exists; pyinfra's server.user does the work otherwise.
    A `.cache` an earlier deploy created as root is handed to the user (the link itself, were it one).
    An existing account that is not such a system user (``account_problem``) fails the host, unchanged.

    + user: the user name
    + home: its home directory
    + group: a supplementary group it is created in

    **Example:**

    .. code:: python

        ownership.service_user(name="Service user", user="sglang", home="/home/sglang")
        ownership.service_user(name="User of qwen", user="sglang-qwen", home="/home/sglang-qwen", group="sglang")
    """
    existing = gathering.read(SystemUser, user=user)
    problem = account_problem(user, home, existing)
    if problem:
        yield fail_host([f"{host.name}: {problem}"])
        return
    if not existing or not existing["home_exists"]:
        yield from server.user._inner(user=user, system=True, home=home, shell="/usr/sbin/nologin",
                                      ensure_home=True, groups=[group] if group else None, comment=ACCOUNT_MARK)
        yield _own_cache(user, home)
        return
    if not existing["marked"]:  # an account taken over, or made before the mark: the deploy's from now on
        yield StringCommand("usermod", "--comment", ACCOUNT_MARK, QuoteString(user))
    if existing["cache_owner"] is None:
        yield _own_cache(user, home)
    elif existing["cache_owner"] != user:
        yield StringCommand("chown", "--no-dereference", f"{user}:{user}", QuoteString(f"{home}/.cache"))
    elif existing["marked"]:
        host.noop(f"user {user} exists with home {home}")


def mark_of(directory: str) -> str:
    """The file the deploy writes in each directory of its own (``marked``): uninstall.py removes a directory
    whole only where it finds it."""
    return f"{directory}/{DIRECTORY_MARK}"


@operation()
def marked(paths: tuple[str, ...]):
    """
    Directories of the deploy's own (root's: install, configuration), each holding the deploy's mark
    (``mark_of``), written once: uninstall.py removes a directory whole only where it finds it, so a knob
    pointed at a system directory (`config_dir=/etc/ssl`) never makes it remove that one.

    + paths: the directories, which exist and are root's

    **Example:**

    .. code:: python

        ownership.marked(name="The deploy's directories", paths=("/opt/specfleet", "/etc/specfleet"))
    """
    states = gathering.read(FileStates, paths=tuple(map(mark_of, paths)))
    missing = [path for path in paths if not matches(states.get(mark_of(path)), "file", "644", "root")]
    if not missing:
        host.noop(f"{', '.join(paths)} carry the deploy's mark")
    for path in missing:
        yield StringCommand("echo", QuoteString(MARK_TEXT), ">", QuoteString(mark_of(path)), "&&",
                            "chmod", "644", QuoteString(mark_of(path)))


@operation()
def root_directories(paths: tuple[str, ...]):
    """
    Directories root writes in or executes from (install, host programs, configuration): root's,
    mode 0755 (a directory an earlier deploy gave the service user is taken back).

    + paths: the directories

    **Example:**

    .. code:: python

        ownership.root_directories(name="Root's directories", paths=("/opt/specfleet", "/etc/specfleet"))
    """
    states = gathering.read(FileStates, paths=paths)
    wrong = [path for path in paths if not matches(states.get(path), "directory", "755", "root")]
    if not wrong:
        host.noop(f"{', '.join(paths)} are root's (0755)")
    for path in wrong:
        yield from files.directory._inner(path=path, user="root", group="root", mode="755")


def upload_paths(install_dir: str, programs: dict[str, Path] | None = None) -> dict[str, Path]:
    """Where each host program goes when uploaded: INSTALL_DIR/bin/NAME.py (every one, unless `programs`)."""
    return {f"{install_dir}/bin/{path.name}": path for _, path in sorted((programs or host_programs.HOST_SCRIPTS).items())}


@operation()
def host_programs_uploaded(install_dir: str, programs: dict[str, Path] | None = None, owner: str = "root"):
    """
    Upload host programs to INSTALL_DIR/bin, root's and mode 0755; only those that differ.

    + install_dir: where they go (its bin/)
    + programs: the programs by name (``of_subject``); every subject's by default
    + owner: their owner and group

    **Example:**

    .. code:: python

        ownership.host_programs_uploaded(name="Host scripts", install_dir="/opt/specfleet")
    """
    paths = upload_paths(install_dir, programs)
    states = gathering.read(FileStates, paths=tuple(paths))
    stale = {dest: src for dest, src in paths.items()
             if not matches(states.get(dest), "file", "755", owner, content=src.read_bytes())}
    if not stale:
        host.noop(f"{len(paths)} host scripts are current")
    for dest, src in stale.items():
        yield from shell.put(src=str(src), dest=dest, user=owner, group=owner, mode="755")
