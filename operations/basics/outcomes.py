"""What each host came to in this run, noted where a subject proves it (a server generating and its accept
length, a gateway routing to its workers, a refusal), for the one table a deploy prints at its end
(operations/run/summary.py)."""

import weakref

# Per pyinfra state (one run): host name -> what its subjects noted.
_notes: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def note(host, **values) -> None:
    """Record `values` for `host` in its run (outside a pyinfra run, nothing)."""
    state = getattr(host, "state", None)
    if state is not None:
        _notes.setdefault(state, {}).setdefault(host.name, {}).update(values)


def note_replica(host, key: str, replica: str, value) -> None:
    """Record `value` for one of `host`'s replicas, under `key` (by replica), in its run."""
    state = getattr(host, "state", None)
    if state is not None:
        _notes.setdefault(state, {}).setdefault(host.name, {}).setdefault(key, {})[replica] = value


def noted(state) -> dict[str, dict]:
    """Every host's notes of the run `state`."""
    return _notes.get(state, {})
