"""Run an operation's body on a host that only answers facts: facts in, commands out.

Only the few Host methods operations call are here (get_fact, noop, name); pyinfra's own
operations used through `_inner` run for real on the same facts.
"""

from types import SimpleNamespace

from pyinfra.api import Config, FunctionCommand, Host, StringCommand
from pyinfra.connectors.util import CommandOutput
from pyinfra.api.operation import OperationMeta
from pyinfra.context import ctx_host, ctx_state


class FakeHost:
    """Answers get_fact from `facts` ({fact class: value}); records noops. `arguments` are the operation's
    global arguments (pyinfra's `host.current_op_global_arguments`: --sudo gives {"_sudo": True}). Another
    inventory host (`state.inventory.get_host(name)`, a gateway's) answers the same facts; `read` records
    on which host each fact was read."""

    name = "host-1"
    groups = ()
    connected = True  # answering facts already (shell.connected connects only a host that is not)

    def __init__(self, facts: dict, arguments: dict | None = None, name: str = name, read: list | None = None):
        self.facts, self.name = facts, name
        self.current_op_global_arguments = arguments or {}
        self.connector_data: dict = {}  # what the connector keeps (a prompted sudo password)
        self.read: list[tuple[str, type]] = [] if read is None else read
        self.noops: list[str] = []
        self.logged: list[str] = []

    def get_fact(self, fact_class, *args, **kwargs):
        self.read.append((self.name, fact_class))
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
    commands, host = run_host(operation, facts, arguments, **kwargs)
    return commands, host.noops


def run_host(operation, facts: dict, arguments: dict | None = None, **kwargs) -> tuple[list, FakeHost]:
    """(commands, the host it ran on): as `run`, with the host's records (noops, which host read each fact)."""
    host = FakeHost(facts, arguments)
    inventory = SimpleNamespace(get_host=lambda name: FakeHost(facts, arguments, name, host.read))
    # pyinfra's defaults (no --diff)
    with ctx_host.use(host), ctx_state.use(SimpleNamespace(config=Config(), cwd=None, inventory=inventory)):
        commands = [str(c) if isinstance(c, (str, StringCommand)) else c for c in operation._inner(**kwargs)]
    return commands, host


def failure(commands: list) -> list[str]:
    """The problems of the one fail_host command an operation yielded."""
    assert len(commands) == 1 and isinstance(commands[0], FunctionCommand), commands
    return commands[0].args[0]


def ran(changed: bool) -> OperationMeta:
    """pyinfra's record of an operation that ran (successfully), with commands when it `changed`."""
    meta = OperationMeta("earlier-operation", is_change=None)
    meta.set_complete(True, ["a command"] if changed else [], CommandOutput([]))
    return meta
