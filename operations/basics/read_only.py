"""Deploy files that only read (status.py, logs.py): each host's part runs while pyinfra prepares the
run, and the last host to finish ends the run there. There is no operation to show, confirm or execute,
and without -y pyinfra would otherwise ask to execute nothing."""

import weakref

from pyinfra.api.arguments import CONNECTOR_ARGUMENT_KEYS, pop_global_arguments

# Per run (pyinfra state): the names of the hosts whose part has finished.
_finished: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def last_to_finish(inventory_host) -> bool:
    """Note that this host's part has finished: True for the last of the run's active hosts to finish."""
    state = inventory_host.state
    finished = _finished.setdefault(state, set())
    finished.add(inventory_host.name)
    return {h.name for h in state.inventory.get_active_hosts()} <= finished


def connector_arguments(inventory_host) -> dict:
    """The run's --sudo, --sudo-user, ... for a command run outside an operation, as pyinfra gives a fact's."""
    arguments, _ = pop_global_arguments(inventory_host.state, inventory_host, {})
    return {key: value for key, value in arguments.items() if key in CONNECTOR_ARGUMENT_KEYS}
