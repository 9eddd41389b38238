"""A host's whole state in one round trip: every fact the deploy's operations compare against,
gathered by one host program (host_scripts/host_state.py) in one Python start.

pyinfra 3 runs a fact's command each time an operation asks for it (it caches nothing), so a no-op
re-run would cost one SSH round trip per fact and a Python start per venv, probe and weights check.
Each subject registers the facts its operations read (`wants`); preflight gathers all of them at
once (`gather`); each operation reads its facts through `read`, which answers from that gathering
while no operation has run a command on the host since, and otherwise (or for a fact the host
program could not answer exactly) runs the fact's own command. Every fact keeps its own command and
its own process(): the host program prints for each the lines that command prints.

A fact is gathered when it names the function of a host program that answers it:
`host_answer = "module.function"` (and `host_answer_how`: "fork" for an answer that forks, run
before any thread starts; "background" for one that waits, run in a thread meanwhile), plus, where
the host needs more than the fact's own arguments, a `host_arguments(kwargs)` classmethod.

A fact the gathering answers from another one's answer names it, `answered_by = OtherFact`, and derives its
value on the controller, `from_answer(answer, **kwargs)`: every gathered answer of OtherFact merged into one
dict, the value (None where that answer does not cover the arguments: the fact's own command then runs). The
weights' state and room are read so: what is on disk needs no hub, so the host program runs while the hub
answers, and the hub's listing is compared on the controller.

A fact whose command reads a value on its standard input (a key no log may hold: pyinfra prints no stdin at
any level) names it, `stdin = value`; its own command and the host program gathering it get it there.
"""

import json
import weakref
from collections.abc import Callable
from typing import Any

from pyinfra import host
from pyinfra.api import FactBase
from pyinfra.context import ctx_host
from pyinfra.facts.server import Arch, LinuxDistribution

from operations.basics.host_programs import inline

Wanted = list[tuple[type[FactBase], dict]]
# What each subject's operations read on a host, given what the deploy was asked (the host's deployment,
# before the hub resolved its revisions: nothing read depends on the hub's answer); registered with `wants`.
_PROVIDERS: list[Callable[[Any], Wanted]] = []
# pyinfra's own facts, answered by the basics' host program.
_PYINFRA_ANSWERS = {Arch: "host_facts.arch", LinuxDistribution: "host_facts.linux_distribution"}
# Per host: the facts its gathering answered, and how many of its operations had run commands then.
_gathered: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def wants(provider: Callable[[Any], Wanted]) -> Callable[[Any], Wanted]:
    """Register the facts a subject's operations read: `provider(deployment)` returns them with the
    arguments those operations pass, or the facts theirs are answered by (`answered_by`) (a decorator)."""
    _PROVIDERS.append(provider)
    return provider


def requests(deployment: Any) -> Wanted:
    """Every fact a deploy of `deployment` reads on a serving host, as the subjects registered them."""
    return [wanted for provider in _PROVIDERS for wanted in provider(deployment)]


def answer_of(fact_class: type[FactBase]) -> str | None:
    return getattr(fact_class, "host_answer", None) or _PYINFRA_ANSWERS.get(fact_class)


def _module(answer: str) -> str:
    return answer.rpartition(".")[0]


class HostState(FactBase):
    """
    Per requested fact, the lines its own command prints, as host_scripts/host_state.py prints them;
    None where the host program cannot answer exactly. ``gather`` parses each with its fact's process().

    .. code:: python

        [["root "], ["0, NVIDIA B200, 183359, 10.0, 580.95.05, Enabled, Disabled"], None]
    """

    default = list

    def command(self, requests: str) -> str:
        modules = tuple(sorted({_module(answer) for _, _, answer, _ in json.loads(requests)}))
        # `|| true`: a host without python3 answers nothing; each fact is then read with its own command.
        return inline("host_state", requests, also=modules) + " || true"

    def process(self, output):
        return json.loads(output[-1])


def key(fact_class: type[FactBase], kwargs: dict) -> tuple:
    """A fact read with these arguments, as the gathering files it."""
    return fact_class.__name__, tuple(sorted(kwargs.items()))


def encoded(wanted: Wanted) -> list[list]:
    """The host program's requests: [fact, arguments, answer, how] for each fact it can answer."""
    return [[fact.__name__, fact.host_arguments(kwargs) if hasattr(fact, "host_arguments") else kwargs,
             answer_of(fact), getattr(fact, "host_answer_how", "inline")]
            for fact, kwargs in wanted]


def _commands_run(on_host) -> int | None:
    """How many of the host's operations have run commands so far (None outside a pyinfra run)."""
    state = getattr(on_host, "state", None)
    if state is None:
        return None
    return sum(1 for op in state.ops.get(on_host, {}).values() if op.operation_meta.executed)


def _this_host():
    return ctx_host.get()  # the Host itself, not pyinfra's per-greenlet proxy of it


def answered(wanted: Wanted) -> dict[tuple, object]:
    """Each fact in `wanted` the host program answered, by (fact name, arguments), from one round trip."""
    gatherable = [(fact, kwargs) for fact, kwargs in wanted if answer_of(fact)]
    answers = host.get_fact(HostState, requests=json.dumps(encoded(gatherable), sort_keys=True),
                            _stdin=stdin_of([fact for fact, _ in gatherable]))
    return {key(fact_class, kwargs): fact_class().process(lines) if lines else fact_class.default()
            # as pyinfra does: no output, the fact's default
            for (fact_class, kwargs), lines in zip(gatherable, answers) if lines is not None}


def stdin_of(facts: list[type[FactBase]]) -> str | None:
    """What the host program answering `facts` reads on its standard input: the one `stdin` they name, if any
    (it reads a single value, once, before it forks)."""
    values = {fact.stdin for fact in facts if getattr(fact, "stdin", None) is not None}
    if len(values) > 1:
        raise ValueError(f"the facts gathered at once name {len(values)} values for stdin; the host program reads one")
    return next(iter(values), None)


def gather(wanted: Wanted) -> None:
    """Read every fact in `wanted` from this host in one round trip, for `read` to answer from."""
    _gathered[_this_host()] = (_commands_run(_this_host()), answered(wanted))


def read(fact_class: type[FactBase], **kwargs):
    """`host.get_fact(fact_class, **kwargs)`, answered from this host's gathering while no operation
    has run a command on the host since. A fact made of parts (`PARTS`) is answered from its parts', one that
    names `answered_by` from that fact's answers."""
    commands_run, found = _gathered.get(_this_host(), (None, {}))
    current = commands_run is not None and commands_run == _commands_run(_this_host())
    if current and key(fact_class, kwargs) in found:
        return found[key(fact_class, kwargs)]
    parts = getattr(fact_class, "PARTS", ())
    if current and parts and all(key(part, {}) in found for part in parts):
        return {part.__name__: found[key(part, {})] for part in parts}
    if current and getattr(fact_class, "answered_by", None):
        value = derived(fact_class, found, kwargs)
        if value is not None:
            return value
    return own_command(fact_class, **kwargs)


def derived(fact_class: type[FactBase], found: dict[tuple, object], kwargs: dict):
    """The fact with these arguments, from the answers in `found` of the fact it is `answered_by`; None
    where they do not cover the arguments."""
    source = fact_class.answered_by.__name__
    merged = {k: v for (name, _), answer in found.items() if name == source for k, v in answer.items()}
    return fact_class.from_answer(merged, **kwargs)


def own_command(fact_class: type[FactBase], **kwargs):
    """The fact read by its own command, with the value it names (`stdin`) on its standard input."""
    if getattr(fact_class, "stdin", None) is not None:
        return host.get_fact(fact_class, **kwargs, _stdin=fact_class.stdin)
    return host.get_fact(fact_class, **kwargs)
