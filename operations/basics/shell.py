"""Commands an operation runs on its host itself (waits, probes, journal reads, a rollback, the gateway's
sync, the benchmark's steps), with the privilege escalation pyinfra gives the operation's own commands.

pyinfra applies `--sudo`, `--sudo-user`, `--su-user`, a sudo password (prompted, `--same-sudo-password`, or
host data `_sudo_password`) to the commands an operation yields and to the facts it reads; a command run
through `host.run_shell_command` in a FunctionCommand gets none of them unless they are passed. `run` and
`get_file` pass the current operation's, so a login with `--sudo` acts as a root login does.

Under an escalation pyinfra moves a file through a temporary copy the login reads or writes
(connectors/ssh.py put_file and get_file), by default `/tmp/pyinfra-<sha1 of the destination>`: a name
any local user can create first and swap, so that root installs its content (or, where
fs.protected_regular is on, every such deploy fails). `put` and `get_file` stage each transfer in a
directory of its own instead, made by the login (mode 0700, a random name) and removed after it.
"""

import secrets
import threading

from pyinfra.api import FunctionCommand, QuoteString
from pyinfra.api.arguments import pop_global_arguments
from pyinfra.api.command import FileUploadCommand, StringCommand
from pyinfra.context import ctx_host
from pyinfra.operations import files

# pyinfra's connector arguments (pyinfra.api.arguments.ConnectorArguments) that say who runs a command
# and through which shell: what the operation's own commands run with.
ESCALATION = ("_sudo", "_sudo_user", "_use_sudo_login", "_sudo_password", "_preserve_sudo_env",
              "_su_user", "_use_su_login", "_preserve_su_env", "_su_shell", "_su_password",
              "_doas", "_doas_user", "_dzdo", "_dzdo_user", "_shell_executable")


def escalation(host) -> dict:
    """The current operation's escalation arguments on `host` (none outside an operation)."""
    arguments = host.current_op_global_arguments or {}
    return {key: arguments[key] for key in ESCALATION if key in arguments}


def sudo_password(host) -> bool:
    """The run hands sudo (or su) a password: pyinfra 3.10 passes it in the environment of every command
    line it escalates (`env SUDO_ASKPASS=... PYINFRA_SUDO_PASSWORD=... sudo -A`, connectors/util.py
    make_unix_command), never on sudo's stdin; prompted once sudo asked for one, it is kept in the host's
    connector data."""
    arguments = escalation(host)
    return bool(arguments.get("_sudo_password") or arguments.get("_su_password")
                or host.connector_data.get("prompted_sudo_password"))


def run(host, command: str | StringCommand, **arguments):
    """`host.run_shell_command(command)` as the current operation's commands run: (ok, output)."""
    return host.run_shell_command(command, **{**escalation(host), **arguments})


# Writes stdin to "$1" through "$1.part", readable by all: root's file, holding no secret, replaced whole.
_WRITE_READABLE = 'umask 022 && cat > "$1.part" && mv -f "$1.part" "$1"'


def write_readable(host, path: str, text: str) -> bool:
    """`text` into root's file at `path`, replaced whole and readable by all (no secret), from the command's
    stdin while the operation executes (a record it measured, a spec it made from what other hosts said)."""
    ok, _ = run(host, StringCommand("sh", "-c", QuoteString(_WRITE_READABLE), "file", QuoteString(path)), _stdin=text)
    return ok


# The escalations under which pyinfra's connectors stage a transfer in a temporary file.
_STAGED = ("_sudo", "_su_user", "_doas", "_dzdo")


def staged(host) -> bool:
    """The current operation's transfers go through a temporary copy (an escalation: --sudo, --su-user...)."""
    arguments = escalation(host)
    return any(arguments.get(key) for key in _STAGED)


def _private_directory() -> str:
    return f"/tmp/specfleet-transfer-{secrets.token_hex(16)}"


def _make_private(state, host, directory: str) -> bool:  # pyinfra passes state and host by these names
    """Made by the login itself (no escalation): the user its SFTP writes and reads as; mkdir fails on
    anything already at the name."""
    ok, output = host.run_shell_command(StringCommand("mkdir", "-m", "700", "--", directory))
    if not ok:
        host.log_styled(f"{host.name}: cannot make the private transfer directory {directory} "
                        f"({' '.join(output.stderr_lines)[:200]}): check that /tmp is writable", fg="red")
    return ok


def _remove_private(state, host, directory: str) -> bool:
    ok, _ = host.run_shell_command(StringCommand("rm", "-rf", "--", directory))  # the login's own directory
    return ok


def put(**arguments):
    """`files.put._inner(**arguments)`, its upload under an escalation staged in a private directory
    instead of pyinfra's /tmp/pyinfra-<sha1>.

    **Example:** ``yield from shell.put(src=StringIO(text), dest="/etc/x", user="root", mode="644")``
    """
    host = ctx_host.get()
    for command in files.put._inner(**arguments):
        if isinstance(command, FileUploadCommand) and staged(host):
            directory = _private_directory()
            command.remote_temp_filename = f"{directory}/upload"
            yield FunctionCommand(_make_private, (directory,), {})
            yield command
            yield FunctionCommand(_remove_private, (directory,), {})
        else:
            yield command


_connecting: dict[str, threading.Lock] = {}  # a gevent lock under pyinfra's CLI, which monkey-patches threading


def connected(other):
    """`other`, an inventory host other than the operation's (a gateway's host, from a worker's operation),
    connected where it is outside --limit. Every command or fact a worker's operation takes there asks this
    first: pyinfra would connect it on a fact read too, unlocked."""
    # The hosts of a batch run their operations side by side (greenlets): two connecting the same host
    # at once would share one SSH client, the first using it while the second is still connecting it.
    with _connecting.setdefault(other.name, threading.Lock()):
        if not other.connected:
            other.connect(raise_exceptions=True)
    return other


def run_elsewhere(other, command: str | StringCommand):
    """`command` on `other`, an inventory host other than the operation's (`connected`), with the escalation
    its own operations take (its data, the run's --sudo). (ok, output)."""
    connected(other)
    arguments, _ = pop_global_arguments(other.state, other, {})
    return other.run_shell_command(command, **{key: arguments[key] for key in ESCALATION if key in arguments})


def get_file(host, remote_path: str, local_path: str) -> bool:
    """`host.get_file` with the current operation's escalation (a file only root may read is copied by it),
    staged in a private directory."""
    if not staged(host):
        return host.get_file(remote_path, local_path, **escalation(host))
    directory = _private_directory()
    if not _make_private(None, host, directory):
        return False
    try:
        return host.get_file(remote_path, local_path, remote_temp_filename=f"{directory}/download",
                             **escalation(host))
    finally:
        _remove_private(None, host, directory)
