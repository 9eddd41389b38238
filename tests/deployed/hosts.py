"""The hosts of a pyinfra inventory, as testinfra hosts over SSH, with what the deploy promised each.

The inventory is loaded by pyinfra's own CLI code (`pyinfra_cli.inventory.make_inventory`,
group_data folders included; in a child process, see load_inventory), so a host here has
exactly the data and groups that `pyinfra INVENTORY deploy.py` gives it; its deployments (and their
replicas) are resolved by the deploy's own `deployment.hosts.resolve_host`, at the commits their
revisions pin. One SSH connection per host, opened as pyinfra's ssh connector opens it and reused by
every check.
"""

from __future__ import annotations

import fnmatch
import functools
import json
import os
import pickle
import shlex
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import testinfra
from pyinfra.api import FactBase
from pyinfra.connectors.ssh import connector_data_meta
from pyinfra.connectors.sshuserclient.client import SSHClient

from deployment.hosts import Deployment, at_commits, host_class_of, resolve_host
from deployment.knobs import COMMIT
from deployment.server.config import Server
from operations.weights.checks import outage
from operations.weights.hub import RepoSnapshot, controller_token, hub_outages, hub_url, snapshot

REPO = Path(__file__).resolve().parents[2]
_UNREACHED: dict[str, str] = {}  # hub URL -> why it did not answer, asked once a session
CONNECT_TIMEOUT = 10  # pyinfra's default (Config.CONNECT_TIMEOUT)
LAB_INVENTORY = REPO / "lab" / "inventory.py"


# pyinfra's CLI entry (`pyinfra_cli`) monkey-patches the stdlib for gevent on import, which
# must not happen inside a test session: the inventory is loaded in a child process, exactly
# as `pyinfra INVENTORY ...` loads it from `cwd`, and each host's name, groups and data
# (host.data.dict(): host, group and group_data values merged) come back pickled.
_LOAD_INVENTORY = r"""
import pickle, sys
path, cwd = sys.argv[1:3]
if cwd not in sys.path:
    sys.path.append(cwd)  # as pyinfra's CLI does
from pyinfra.api import State
from pyinfra.context import ctx_state
from pyinfra_cli.inventory import make_inventory
state = State(check_for_changes=False)
state.cwd = cwd
with ctx_state.use(state):
    inventory = make_inventory(path, cwd=cwd)
hosts = []
for host in inventory:
    data = {}
    for key, value in host.data.dict().items():
        try:
            data[key] = pickle.dumps(value)
        except Exception:
            pass  # callables and the like: nothing the checks read
    hosts.append((host.name, list(host.groups), data))
sys.stdout.buffer.write(pickle.dumps(hosts))
"""


class HostData:
    """`host.data` as pyinfra resolves it for one host (attribute access, .get)."""

    def __init__(self, values: dict[str, Any]):
        self.__dict__["_values"] = values

    def __getattr__(self, key: str):
        try:
            return self._values[key]
        except KeyError:
            raise AttributeError(f"host has no data {key!r}") from None

    def get(self, key: str, default=None):
        return self._values.get(key, default)

    def dict(self) -> dict[str, Any]:
        return dict(self._values)


def hub_snapshot(endpoint: str | None, token: str | None, repo_id: str, revision: str) -> RepoSnapshot:
    """The hub's snapshot, as the deploy's preflight asks it. A hub that does not answer is asked once a session:
    every check that needs it is skipped with one reason (pytest -ra counts them on one line), the others run."""
    where = hub_url(endpoint)
    if where not in _UNREACHED:
        try:
            return snapshot(endpoint, token, repo_id, revision)
        except hub_outages() as error:
            _UNREACHED[where] = outage(where, error)
    pytest.skip(f"{_UNREACHED[where]}; the checks that compare a host with the hub are skipped, the others run")


@dataclass(frozen=True)
class InventoryHost:
    name: str
    groups: list[str]
    data: HostData


@functools.lru_cache(maxsize=None)
def load_inventory(path: str, cwd: str) -> dict[str, InventoryHost]:
    """The hosts of `pyinfra PATH ...` run from `cwd` (its group_data folder, then the inventory's)."""
    if not Path(path).is_file():
        raise FileNotFoundError(f"no inventory file {path}")
    result = subprocess.run([sys.executable, "-c", _LOAD_INVENTORY, path, cwd], cwd=cwd,
                            capture_output=True, timeout=120)
    if result.returncode != 0:
        raise RuntimeError(result.stderr.decode(errors="replace").strip().splitlines()[-1])
    hosts = {}
    for name, groups, data in pickle.loads(result.stdout):
        values = {}
        for key, value in data.items():
            try:
                values[key] = pickle.loads(value)
            except Exception:
                pass
        hosts[name] = InventoryHost(name, groups, HostData(values))
    return hosts


def matches(name: str, groups, patterns: list[str]) -> bool:
    """pyinfra's --limit: a pattern names a group, else is a glob on host names."""
    return not patterns or any(p in groups or fnmatch.fnmatch(name, p) for p in patterns)


def ssh_client(host) -> SSHClient:
    """The connection pyinfra's ssh connector makes to `host`: its own paramiko client (which
    honours ~/.ssh/config, ProxyJump, known_hosts and strict host key checking as pyinfra does)
    with the keyword arguments SSHConnector.make_paramiko_kwargs builds from the ssh_* data."""

    def data(key: str):
        value = host.data.get(key)
        return connector_data_meta[key].default if value is None else value

    kwargs: dict[str, Any] = {
        "allow_agent": False,
        "look_for_keys": False,
        "_pyinfra_ssh_forward_agent": data("ssh_forward_agent"),
        "_pyinfra_ssh_config_file": data("ssh_config_file"),
        "_pyinfra_ssh_known_hosts_file": data("ssh_known_hosts_file"),
        "_pyinfra_ssh_strict_host_key_checking": data("ssh_strict_host_key_checking"),
        "_pyinfra_ssh_paramiko_connect_kwargs": data("ssh_paramiko_connect_kwargs"),
        "timeout": CONNECT_TIMEOUT,
    }
    if data("ssh_user"):
        kwargs["username"] = data("ssh_user")
    if data("ssh_port"):
        kwargs["port"] = int(data("ssh_port"))
    if data("ssh_password"):
        kwargs["password"] = data("ssh_password")
    if data("ssh_key"):
        kwargs["key_filename"] = os.path.expanduser(data("ssh_key"))
        kwargs["passphrase"] = data("ssh_key_password")
    else:
        kwargs["allow_agent"] = data("ssh_allow_agent")
        kwargs["look_for_keys"] = data("ssh_look_for_keys")
    client = SSHClient()
    client.connect(data("ssh_hostname") or host.name, **kwargs)
    return client


@dataclass
class Target:
    """One inventory host under test: its pyinfra host, class, deployment and testinfra host."""

    name: str
    host: InventoryHost  # name, groups and data of the pyinfra host
    lab_mode: bool  # deployed by this session's deployed_lab fixture
    node_members: dict | None = None  # its node group's hosts (operations.nodes.members), if it is in one
    sudo: bool = False  # testinfra's --sudo: the checks run through sudo (a login other than root)
    sudo_user: str | None = None
    _memo: dict = field(default_factory=dict)

    @functools.cached_property
    def host_class(self) -> str:
        return host_class_of(self.host.groups)

    @functools.cached_property
    def resolved(self) -> tuple[Deployment, ...]:
        """Its deployments as its data says them (a branch revision not yet at a commit)."""
        return resolve_host(self.host.data, self.host_class, self.node_members)

    @functools.cached_property
    def deployments(self) -> tuple[Deployment, ...]:
        """Its deployments at the commits the deploy served: a pinned commit, or for a branch the commit
        the hub says it is at now (operations.weights.hub.snapshot, with the deploy's token)."""
        def commit(d: Deployment, repo) -> str:
            if COMMIT.fullmatch(repo.revision):
                return repo.revision
            try:
                return hub_snapshot(d.weights.hf_endpoint, self.hf_token(), repo.repo_id, repo.revision).commit
            except Exception as problem:  # HubProblem: the hub answered, not as the deploy needs
                pytest.fail(f"{self.name}: expected to resolve {repo.repo_id}@{repo.revision} on the hub to find "
                            f"its revision's directory, found {type(problem).__name__}: {problem}")
        return tuple(at_commits(d, {r.role: commit(d, r) for r in d.weights.repos}) for d in self.resolved)

    @property
    def deployment(self) -> Deployment:
        """Its first deployment: what every deployment of the host shares (GPUs, service user, paths)."""
        return self.deployments[0]

    @property
    def replicas(self) -> tuple[Server, ...]:
        """Every SGLang unit its deployments want, one a replica."""
        return tuple(replica for d in self.deployments for replica in d.replicas)

    @property
    def serves_http(self) -> bool:
        """Rank >= 1 of a node group serves no model (rank 0 serves for the group)."""
        group = self.deployment.node_group
        return group is None or group.serves_http

    def use(self, infra) -> None:
        """Check through this testinfra host (testinfra's --hosts made it) instead of pyinfra's connection."""
        self._memo["testinfra"] = self._as_root(infra)

    def _as_root(self, infra):
        """`infra` if its commands run as root (a root login, or --sudo), else why not, in one line."""
        user = infra.run("id -un").stdout.strip()
        if user == "root":
            return infra
        return (f"{self.name}: the checks run as {user or 'an unknown user'}, but they read root's files: "
                + ("drop --sudo-user" if infra.backend.sudo else "add --sudo (testinfra's, sudo without a password)"))

    @property
    def testinfra(self):
        """testinfra's paramiko backend, on the connection pyinfra would open (ssh_client), its commands as
        root (a root login, or --sudo).

        Opened once; a host that cannot be reached fails each of its tests at once, saying why.
        """
        if "testinfra" not in self._memo:
            data = self.host.data
            try:
                client = ssh_client(self.host)
            except Exception as error:
                self._memo["testinfra"] = (f"{self.name}: expected an SSH connection as pyinfra makes it "
                                           f"(ssh_hostname {data.get('ssh_hostname') or self.name}, "
                                           f"ssh_user {data.get('ssh_user')}), found {type(error).__name__}: {error}")
            else:
                user = data.get("ssh_user")
                spec = f"paramiko://{user + '@' if user else ''}{data.get('ssh_hostname') or self.name}"
                infra = testinfra.get_host(spec, sudo=self.sudo or bool(data.get("_sudo")),
                                           sudo_user=self.sudo_user or data.get("_sudo_user"))
                infra.backend.client = client  # in place of testinfra's own connect
                self._memo["testinfra"] = self._as_root(infra)
        if isinstance(self._memo["testinfra"], str):
            pytest.fail(self._memo["testinfra"], pytrace=False)
        return self._memo["testinfra"]

    def close(self) -> None:
        backend = getattr(self._memo.get("testinfra"), "backend", None)
        if getattr(backend, "client", None) is not None:
            backend.client.close()

    def memo(self, key: str, compute):
        """Each batch of commands runs once per host and session, whichever test asks first."""
        if key not in self._memo:
            self._memo[key] = compute()
        return self._memo[key]

    def run(self, command: str):
        return self.testinfra.run(command)

    def facts(self, **facts: FactBase | tuple[FactBase, dict]) -> dict[str, Any]:
        """pyinfra facts' own commands and parsers, batched into one command: {name: value}.

        A value is what pyinfra's get_fact returns: process(stdout lines), or the fact's
        default when the command printed nothing.
        """
        marker = "@@specfleet-fact "
        parts = []
        for name, fact in facts.items():
            fact, kwargs = fact if isinstance(fact, tuple) else (fact, {})
            parts.append(f"echo {shlex.quote(marker + name)}; ( {fact.command(**kwargs)} )")
        output = self.run("; ".join(parts)).stdout
        lines: dict[str, list[str]] = {}
        current = None
        for line in output.splitlines():
            if line.startswith(marker):
                current = lines.setdefault(line[len(marker):], [])
            elif current is not None:
                current.append(line)
        values = {}
        for name, fact in facts.items():
            fact = fact[0] if isinstance(fact, tuple) else fact
            values[name] = fact.process(lines[name]) if lines.get(name) else fact.default()
        return values

    def python(self, script: str, *args: str, stdin: bytes | None = None) -> Any:
        """Run `script` with the host's python3 (stdlib only) and return the JSON it prints last.

        `stdin` travels over the SSH channel, never in a command line (the HF token does).
        """
        command = " ".join(shlex.quote(part) for part in ("python3", "-c", script, *args))
        backend = self.testinfra.backend
        command = backend.get_command(command)  # with sudo where the host's _sudo asks
        if getattr(backend, "client", None) is None:  # testinfra's ssh backend (--hosts ssh://): the ssh binary
            ssh, ssh_args = backend._build_ssh_command(command)
            ran = subprocess.run(backend.quote(" ".join(ssh), *ssh_args), shell=True, input=stdin or b"",
                                 capture_output=True, timeout=300)
            stdout, stderr, status = ran.stdout, ran.stderr, ran.returncode
        else:
            channel = backend.client.get_transport().open_session()
            channel.exec_command(command)
            if stdin is not None:
                channel.sendall(stdin)
            channel.shutdown_write()
            stdout = b"".join(channel.makefile("rb"))
            stderr = b"".join(channel.makefile_stderr("rb"))
            status = channel.recv_exit_status()
        lines = stdout.decode(errors="replace").strip().splitlines()
        if status != 0 or not lines:
            raise AssertionError(f"{self.name}: expected a check script to run with the host's python3, found "
                                 f"exit {status}: {stderr.decode(errors='replace')[-600:]}")
        return json.loads(lines[-1])

    def hf_token(self) -> str | None:
        """The HF token the deploy used: the controller's, as operations.hub reads it.

        A lab host with no token on the controller was deployed with the lab's granted
        token (`make demo`, tests/conftest.py run_deploy).
        """
        from lab.config import TOKEN_GRANTED

        if self.lab_mode:
            return TOKEN_GRANTED
        token = controller_token(self.resolved[0].weights.hf_token_env)
        if not token and "lab" in self.host.groups:
            return TOKEN_GRANTED
        return token
