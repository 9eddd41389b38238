"""How the real inventories reach their hosts: known targets only, verified host keys, your SSH config.

- A target is an address from an environment variable or a `Host` entry of your SSH config;
  nothing is guessed, so an unset variable stops the run with one line saying what to set.
- Host keys are verified (`StrictHostKeyChecking yes`): pyinfra's own default, accept-new, would
  trust any key on first use and override your SSH config. Set SPECFLEET_SSH_STRICT_HOST_KEY_CHECKING
  (yes, accept-new, no) to choose otherwise.
- The user is your SSH config's `User` (or SPECFLEET_SSH_USER); never an assumed root.
"""

import os

from pyinfra.connectors.sshuserclient.client import get_ssh_config



def in_ssh_config(name: str) -> bool:
    """`name` has its own `Host` entry (with a HostName) in the user's SSH config."""
    config = get_ssh_config(os.path.expanduser("~/.ssh/config"))  # memoized per path: the path is explicit
    return bool(config and name in config.get_hostnames() and config.lookup(name).get("hostname"))


def ssh_data(user_env: str = "SPECFLEET_SSH_USER") -> dict:
    """Host data for pyinfra's SSH connector: strict host keys; a user only when one is given."""
    strict = os.environ.get("SPECFLEET_SSH_STRICT_HOST_KEY_CHECKING", "yes")
    if strict not in ("yes", "accept-new", "no"):
        raise SystemExit(f"SPECFLEET_SSH_STRICT_HOST_KEY_CHECKING={strict!r}: use yes, accept-new or no")
    data = {"ssh_strict_host_key_checking": strict}
    if os.environ.get(user_env):
        data["ssh_user"] = os.environ[user_env]
    return data


def targets(env: str, example: str) -> list[str]:
    """The comma-separated names in `env`; stops the run with what to set when there are none."""
    names = [name.strip() for name in os.environ.get(env, "").split(",") if name.strip()]
    if not names:
        raise SystemExit(f"{env} is not set: export {env}={example} (addresses, or Host names "
                         "from your SSH config)")
    return names
