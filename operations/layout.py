"""Who owns what on a host: the service user and its cache, root's directories, the host scripts.

The service user owns its home and cache (where the server and the downloads write); every
directory root writes in or executes from (install and config directories) is root's and
not writable by the service user, so no link it plants can redirect what root does.
"""

import shlex
from pathlib import Path

from pyinfra import host
from pyinfra.api import FactBase, QuoteString, StringCommand, operation
from pyinfra.operations import files, server

from operations import host_state
from operations.deployment import Deployment
from operations.filestate import FileStates, matches, sha1_of

HOST_SCRIPTS = Path(__file__).resolve().parent / "host_scripts"


class SystemUser(FactBase):
    """
    A user's home directory, whether it exists, and the owner of its `.cache` (not following a
    link there; None if absent); None when there is no such user.

    .. code:: python

        {"home": "/home/sglang", "home_exists": True, "cache_owner": "sglang"}
    """

    def command(self, user: str) -> str:
        return (f"getent passwd {shlex.quote(user)} | cut -d: -f6 | while read -r home; do "
                'if [ -d "$home" ]; then echo "$home yes $(stat -c %U "$home/.cache" 2>/dev/null || echo -)"; '
                'else echo "$home no -"; fi; done')

    def process(self, output):
        home, exists, cache_owner = output[0].rsplit(" ", 2)
        return {"home": home, "home_exists": exists == "yes", "cache_owner": None if cache_owner == "-" else cache_owner}


@operation()
def service_user(user: str, home: str):
    """
    The service's system user, with its home (where HF_HOME lives), no login shell, and its own `.cache`.

    One fact in the usual case where it exists; pyinfra's server.user does the work otherwise.
    A `.cache` an earlier deploy created as root is handed to the user (the link itself, were it one).

    + user: the user name
    + home: its home directory

    **Example:**

    .. code:: python

        layout.service_user(name="Service user", user="sglang", home="/home/sglang")
    """
    existing = host_state.read(SystemUser, user=user)
    if not existing or existing["home"] != home or not existing["home_exists"]:
        yield from server.user._inner(user=user, system=True, home=home, shell="/usr/sbin/nologin",
                                      ensure_home=True)
    elif existing["cache_owner"] not in (None, user):
        yield StringCommand("chown", "--no-dereference", f"{user}:{user}", QuoteString(f"{home}/.cache"))
    else:
        host.noop(f"user {user} exists with home {home}")


@operation()
def root_directories(deployment: Deployment):
    """
    The install, host script and config directories: root's, mode 0755 (an earlier deploy made the
    config directory the service user's).

    + deployment: the host's resolved deployment (install and config directories)

    **Example:**

    .. code:: python

        layout.root_directories(name="Root's directories", deployment=deployment)
    """
    d = deployment
    paths = (d.install_dir, f"{d.install_dir}/bin", d.config_dir)
    states = host_state.read(FileStates, paths=paths)
    wrong = [path for path in paths if not matches(states.get(path), "directory", "755", "root")]
    if not wrong:
        host.noop(f"{', '.join(paths)} are root's (0755)")
    for path in wrong:
        yield from files.directory._inner(path=path, user="root", group="root", mode="755")


def host_script_paths(deployment: Deployment) -> tuple[str, ...]:
    """Where each host script goes: INSTALL_DIR/bin/NAME, in the order of their names."""
    return tuple(f"{deployment.install_dir}/bin/{script.name}" for script in sorted(HOST_SCRIPTS.glob("*.py")))


@operation()
def host_scripts(deployment: Deployment):
    """
    Upload the host-side scripts: the weights fetcher, the SGLang launcher and the readiness probe.

    + deployment: the host's resolved deployment (install directory)

    **Example:**

    .. code:: python

        layout.host_scripts(name="Install specfleet's host scripts", deployment=deployment)
    """
    scripts = dict(zip(host_script_paths(deployment), sorted(HOST_SCRIPTS.glob("*.py"))))
    states = host_state.read(FileStates, paths=tuple(scripts))
    stale = {dest: script for dest, script in scripts.items()
             if not matches(states.get(dest), "file", "755", "root", sha1=sha1_of(script.read_bytes()))}
    if not stale:
        host.noop(f"{len(scripts)} host scripts are current")
    for dest, script in stale.items():
        yield from files.put._inner(src=str(script), dest=dest, user="root", group="root", mode="755")
