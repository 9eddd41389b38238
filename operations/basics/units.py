"""A systemd unit's files and state, as the operations that write units compare against them."""

import shlex

from pyinfra.api import FactBase


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
