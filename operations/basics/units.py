"""A systemd unit's files and state, as the operations that write units compare against them."""

import shlex
from collections.abc import Iterable

from pyinfra.api import FactBase
from pyinfra.api.operation import OperationMeta


def any_change(operations: Iterable[OperationMeta]) -> bool:
    """Whether any of `operations` changes the host: what it did once it ran (`did_change`), what it will
    do before then (`will_change`: while pyinfra prepares the run, and all through --dry)."""
    return any(op.did_change() if op.is_complete() else op.will_change for op in operations)


class ServiceState(FactBase):
    """
    The unit and environment files' sha1 (None if absent) and the service's active and enabled state.

    .. code:: python

        {"unit_sha1": "5f1d...", "env_sha1": "9a0b...", "active": "active", "enabled": "enabled"}
    """

    host_answer = "host_facts.service_state"

    def command(self, unit_file: str, env_file: str, service: str) -> str:
        return "; ".join([
            *(f"(sha1sum {shlex.quote(f)} 2>/dev/null || echo -) | cut -d' ' -f1" for f in (unit_file, env_file)),
            f"systemctl is-active {shlex.quote(service)}",
            f"systemctl is-enabled {shlex.quote(service)} 2>/dev/null || echo disabled",
        ])

    def process(self, output):
        unit, env, active, enabled = [*output, "", "", "", ""][:4]
        return {"unit_sha1": None if unit == "-" else unit, "env_sha1": None if env == "-" else env,
                "active": active, "enabled": enabled}
