"""How the real inventories reach their hosts: known targets only, verified host keys, your SSH config.

- A target is an address from an environment variable or a `Host` entry of your SSH config;
  nothing is guessed, so an unset variable stops the run with one line saying what to set.
- Host keys are verified (`StrictHostKeyChecking yes`): pyinfra's own default, accept-new, would
  trust any key on first use and override your SSH config. Set SPECFLEET_SSH_STRICT_HOST_KEY_CHECKING
  (yes, accept-new, no) to choose otherwise.
- A jump host (`ProxyJump` in your SSH config) is checked too: pyinfra connects to it with the
  hop's own `StrictHostKeyChecking` only (the inventory's setting does not reach it; unset, it
  asks on the terminal and stores an unknown key), so a target behind a hop whose Host entry does
  not say `StrictHostKeyChecking yes` (or what SPECFLEET_SSH_STRICT_HOST_KEY_CHECKING chose) stops the
  run with one line naming the hop.
- The user is your SSH config's `User`, else SPECFLEET_SSH_USER (an inventory's own variable, such as
  SPECFLEET_CT200_USER, first); never an assumed root. A user other than root deploys with pyinfra's --sudo.
- SPECFLEET_GATEWAY_HOST puts a host in the `gateway` group (SGLang's model gateway in front of the
  inventory's workers): one of the workers, which then carries the gateway beside its server, or a
  GPU-less host of its own.
"""

import os

from pyinfra.connectors.sshuserclient.client import get_ssh_config



def in_ssh_config(name: str) -> bool:
    """`name` has its own `Host` entry (with a HostName) in the user's SSH config."""
    config = get_ssh_config(os.path.expanduser("~/.ssh/config"))  # memoized per path: the path is explicit
    return bool(config and name in config.get_hostnames() and config.lookup(name).get("hostname"))


STRICTNESS = ("no", "accept-new", "yes")  # StrictHostKeyChecking values, laxest first


def jump_hop_problem(target: str, strict: str, config_file: str = "~/.ssh/config") -> str | None:
    """Why a ProxyJump hop on the way to `target` would be trusted less than `strict` says: pyinfra
    (sshuserclient.client.SSHClient.parse_config) connects each hop with that hop's own
    StrictHostKeyChecking from the SSH config, and without one asks on the terminal (its AskPolicy)."""
    config = get_ssh_config(os.path.expanduser(config_file))
    hops = config.lookup(target).get("proxyjump", "none") if config else "none"
    if hops.lower() == "none":
        return None
    for hop in hops.split(","):
        name = hop.rsplit("@", 1)[-1]
        name = name if name.count(":") > 1 else name.rsplit(":", 1)[0]  # as pyinfra's derive_shorthand
        given = config.lookup(name).get("stricthostkeychecking", "ask").lower()
        if given not in STRICTNESS or STRICTNESS.index(given) < STRICTNESS.index(strict):
            return (f"{target}: its ProxyJump hop {name} is connected with StrictHostKeyChecking {given} "
                    f"(pyinfra applies only the hop's own setting): add `StrictHostKeyChecking {strict}` to the "
                    f"`Host {name}` entry of your SSH config, with the hop's key in known_hosts")
    return None


def ssh_data(*user_envs: str, target: str | None = None) -> dict:
    """Host data for pyinfra's SSH connector: strict host keys, also for a jump host on the way to
    `target`; a user only when a variable names one (the first of `user_envs` that is set, then
    SPECFLEET_SSH_USER)."""
    strict = os.environ.get("SPECFLEET_SSH_STRICT_HOST_KEY_CHECKING", "yes")
    if strict not in STRICTNESS:
        raise SystemExit(f"SPECFLEET_SSH_STRICT_HOST_KEY_CHECKING={strict!r}: use yes, accept-new or no")
    problem = jump_hop_problem(target, strict) if target else None
    if problem:
        raise SystemExit(problem)
    data = {"ssh_strict_host_key_checking": strict}
    user = next((os.environ[name] for name in (*user_envs, "SPECFLEET_SSH_USER") if os.environ.get(name)), None)
    if user:
        data["ssh_user"] = user
    return data


def gateway(workers: list[tuple[str, dict]]) -> list[tuple[str, dict]]:
    """The `gateway` group: the host SPECFLEET_GATEWAY_HOST names, else none. A worker named there carries
    the gateway beside its server (reached on loopback); another name is a GPU-less gateway host, reached
    like the workers (its workers then listen beyond loopback, with a key: README, "A gateway")."""
    name = os.environ.get("SPECFLEET_GATEWAY_HOST", "").strip()
    if not name:
        return []
    if any(worker == name for worker, _ in workers):
        return [(name, {})]  # its connection data comes with its worker entry
    return [(name, ssh_data())]


def targets(env: str, example: str) -> list[str]:
    """The comma-separated names in `env`; stops the run with what to set when there are none."""
    names = [name.strip() for name in os.environ.get(env, "").split(",") if name.strip()]
    if not names:
        raise SystemExit(f"{env} is not set: export {env}={example} (addresses, or Host names "
                         "from your SSH config)")
    return names
