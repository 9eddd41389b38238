"""Commands an operation runs on its host itself (waits, probes, journal reads, a rollback, the gateway's
sync, the benchmark's steps), with the privilege escalation pyinfra gives the operation's own commands.

pyinfra applies `--sudo`, `--sudo-user`, `--su-user`, a sudo password (prompted, `--same-sudo-password`, or
host data `_sudo_password`) to the commands an operation yields and to the facts it reads; a command run
through `host.run_shell_command` in a FunctionCommand gets none of them unless they are passed. `run` and
`get_file` pass the current operation's, so a login with `--sudo` acts exactly as a root login does.
"""

from pyinfra.api.arguments import pop_global_arguments
from pyinfra.api.command import StringCommand

# pyinfra's connector arguments (pyinfra.api.arguments.ConnectorArguments) that say who runs a command
# and through which shell: what the operation's own commands run with.
ESCALATION = ("_sudo", "_sudo_user", "_use_sudo_login", "_sudo_password", "_preserve_sudo_env",
              "_su_user", "_use_su_login", "_preserve_su_env", "_su_shell", "_su_password",
              "_doas", "_doas_user", "_dzdo", "_dzdo_user", "_shell_executable")


def escalation(host) -> dict:
    """The current operation's escalation arguments on `host` (none outside an operation)."""
    arguments = host.current_op_global_arguments or {}
    return {key: arguments[key] for key in ESCALATION if key in arguments}


def run(host, command: str | StringCommand, **arguments):
    """`host.run_shell_command(command)` as the current operation's commands run: (ok, output)."""
    return host.run_shell_command(command, **{**escalation(host), **arguments})


def run_elsewhere(other, command: str | StringCommand):
    """`command` on `other`, an inventory host other than the operation's (a gateway's host, from a worker's
    operation), with the escalation its own operations take (its data, the run's --sudo): connected first
    where it is outside --limit. (ok, output)."""
    if not other.connected:
        other.connect(raise_exceptions=True)
    arguments, _ = pop_global_arguments(other.state, other, {})
    return other.run_shell_command(command, **{key: arguments[key] for key in ESCALATION if key in arguments})


def get_file(host, remote_path: str, local_path: str) -> bool:
    """`host.get_file` with the current operation's escalation (a file only root may read is copied by it)."""
    return host.get_file(remote_path, local_path, **escalation(host))
