"""Run an operation's body on a host that only answers facts: facts in, commands out.

Only the few Host methods operations call are here (get_fact, noop, name); pyinfra's own
operations used through `_inner` run for real on the same facts.
"""

from types import SimpleNamespace

from pyinfra.api import Config, FunctionCommand, Host, StringCommand
from pyinfra.context import ctx_host, ctx_state


class FakeHost:
    """Answers get_fact from `facts` ({fact class: value}); records noops. `arguments` are the operation's
    global arguments (pyinfra's `host.current_op_global_arguments`: --sudo gives {"_sudo": True})."""

    name = "host-1"

    def __init__(self, facts: dict, arguments: dict | None = None):
        self.facts = facts
        self.current_op_global_arguments = arguments or {}
        self.connector_data: dict = {}  # what the connector keeps (a prompted sudo password)
        self.noops: list[str] = []
        self.logged: list[str] = []

    def get_fact(self, fact_class, *args, **kwargs):
        return self.facts[fact_class]

    get_temp_filename = Host.get_temp_filename  # pyinfra's own naming, in the host's /tmp

    def _get_temp_directory(self) -> str:
        return "/tmp"

    def noop(self, description: str) -> None:
        self.noops.append(description)

    def log_styled(self, message: str, **_style) -> None:
        self.logged.append(message)


def run(operation, facts: dict, arguments: dict | None = None, **kwargs) -> tuple[list, list[str]]:
    """(commands, noops): a shell command as its masked text, any other command as itself."""
    host = FakeHost(facts, arguments)
    with ctx_host.use(host), ctx_state.use(SimpleNamespace(config=Config(), cwd=None)):  # pyinfra's defaults (no --diff)
        commands = [str(c) if isinstance(c, (str, StringCommand)) else c for c in operation._inner(**kwargs)]
    return commands, host.noops


def failure(commands: list) -> list[str]:
    """The problems of the one fail_host command an operation yielded."""
    assert len(commands) == 1 and isinstance(commands[0], FunctionCommand), commands
    return commands[0].args[0]
