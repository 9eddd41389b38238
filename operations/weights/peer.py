"""The peer server of the weights' fan-out: how a host serves its revisions to the run's other hosts.

nginx from the operating system's packages (Debian's and Ubuntu's `nginx`), not a server of specfleet's
own: it serves files read-only with sendfile and HTTP Range (a fetcher that broke off continues where
it stopped). It runs in a unit of its own (templates/weights/weights-peer.service.j2) as a user of its
own in the weights' group, which reads the weights and owns nothing, confined as the other units are
(`systemd-analyze security` at most 3.0), and with root's configuration of the servers (the API keys)
out of its reach. It serves the revisions of the run's fan-out only, each at `/<repo dir>/<commit>/`
(fanout.peer_url), to the run's peers' addresses only; never a listing, never the fetcher's files in
flight (`.cache/`), never a link. To the same addresses it serves the run's nonce (NONCE_PATH), its unit's
credential, which the peers' probe asks for: a process that took the port while no peer server ran has
no nonce to answer. Its unit is started while the fan-out runs and stopped after it, unless
`weights_cache=true` keeps it (enabled at boot: a site cache for later revisions and hosts).
"""

import ipaddress
import posixpath
import re
import secrets
from dataclasses import dataclass, field
from io import StringIO

from pyinfra import host
from pyinfra.api import QuoteString, StringCommand, operation
from pyinfra.facts.deb import DebPackages

from deployment import knobs
from deployment.weights.config import Weights
from operations.basics import apt_packages, gathering, shell
from operations.basics.file_states import FileStates, matches
from operations.basics.secret_files import write_secret
from operations.basics.templates import render

UNIT = "specfleet-weights-peer"
PACKAGES = ("nginx",)
# Where each peer server answers its run's nonce (sharing.reachable's probe); no revision directory is named so.
NONCE_PATH = "specfleet-fanout-nonce"
NONCE_FILE = "nonce"  # root's (0600) beside the configuration, the unit's credential: served as a file


@dataclass(frozen=True)
class Nonce:
    """A run's proof that a peer's answer comes from the server the run configured: each peer server answers it at
    NONCE_PATH, read from a credential of its unit that no other process of the host reads. Never printed: an
    operation's arguments show at -v, and its repr leaves the value out."""

    value: str = field(default_factory=lambda: secrets.token_hex(16), repr=False)


# A revision's directory under the weights directory, as fanout.Revision.path names it.
REVISION_PATH = re.compile(rf"[A-Za-z0-9][A-Za-z0-9._-]*--[A-Za-z0-9][A-Za-z0-9._-]*/{knobs.COMMIT.pattern}")


def conf_dir_beside(config_dir: str) -> str:
    """The peer server's configuration directory: beside root's configuration directory, not in it (the
    unit cannot read that one)."""
    return f"{config_dir}-weights-peer"


@dataclass(frozen=True)
class PeerServer:
    """One host's peer server: whom it serves, what, where, as whom."""

    reader: str  # the weights' group (the service user's)
    weights_dir: str
    port: int  # `weights_fanout_port`
    allowed: tuple[str, ...]  # the run's peers' IP addresses
    revisions: tuple[str, ...]  # the revisions it serves, `<repo dir>/<commit>` each
    cache: bool  # `weights_cache`: kept running after the run
    config_dir: str  # root's configuration of the servers, out of its reach

    @property
    def unit(self) -> str:
        return UNIT

    @property
    def conf_dir(self) -> str:
        return conf_dir_beside(self.config_dir)

    @property
    def conf_file(self) -> str:
        return f"{self.conf_dir}/nginx.conf"

    @property
    def runtime_dir(self) -> str:
        return f"/run/{UNIT}"

    @property
    def credentials_dir(self) -> str:
        """Where systemd hands the unit its credentials (LoadCredential=), readable by the unit's user alone."""
        return f"/run/credentials/{UNIT}.service"


def server(weights: Weights, weights_dir: str, peers: tuple[str, ...], revisions: tuple[str, ...]) -> PeerServer:
    """The host's peer server for the run's fan-out: `peers`, the addresses of the hosts that take revisions
    from it (fanout.Holder.address); `revisions`, what it serves of them (fanout.Revision.path). A peer's
    address that is no IP address (nginx allows addresses, not names) or a malformed revision raises
    BadHostData."""
    allowed = []
    for address in peers:
        try:
            allowed.append(str(ipaddress.ip_address(address)))
        except ValueError:
            raise knobs.refused("a fan-out peer's address", address, "give the peer's inventory entry its IP "
                                "address (gateway_worker_address or ssh_hostname): the peer server allows "
                                "addresses, not names", wrong="is not an IP address") from None
    for revision in revisions:
        if not REVISION_PATH.fullmatch(revision) or posixpath.normpath(revision) != revision:
            raise knobs.refused("a fan-out revision", revision, "use <owner>--<name>/<40-hex commit>")
    return PeerServer(reader=weights.reader, weights_dir=weights_dir,
                      port=weights.fanout_port, allowed=tuple(sorted(set(allowed))),
                      revisions=tuple(sorted(set(revisions))), cache=weights.cache, config_dir=weights.config_dir)


def conf_text(p: PeerServer) -> str:
    return render("weights/peer-nginx.conf.j2", p=p, commit=knobs.COMMIT.pattern, nonce_path=NONCE_PATH,
                  nonce_file=NONCE_FILE)


def unit_text(p: PeerServer) -> str:
    return render("weights/weights-peer.service.j2", p=p, nonce_file=NONCE_FILE)


UNIT_FILE = f"/etc/systemd/system/{UNIT}.service"


@operation()
def package():
    """
    Debian's nginx for the peer server, its own ``nginx.service`` masked before the package is installed:
    that one would start at once and at every boot, serving /var/www on port 80 to anyone.

    **Example:**

    .. code:: python

        peer.package(name="Weights peer server package")
    """
    if all(name in host.get_fact(DebPackages) for name in PACKAGES):
        host.noop("nginx is installed (its own nginx.service masked)")
        return
    yield "systemctl mask nginx.service"
    yield from apt_packages.install(list(PACKAGES))


@operation()
def serving(server: PeerServer, nonce: Nonce):
    """
    The peer server's configuration, the run's nonce and the unit written, and the server (re)started on them:
    called on a run where a host of the fan-out lacks a revision, before any download. Enabled at boot only
    with `weights_cache`.

    + server: this host's peer server (``server``)
    + nonce: the run's (sharing.RunFanout), which it answers its peers' probes with

    **Example:**

    .. code:: python

        peer.serving(name="Weights peer server", server=part.server, nonce=part.run.nonce)
    """
    yield StringCommand("mkdir", "-p", "-m", "755", QuoteString(server.conf_dir))
    # On stdin, root's file (0600): the unit reads it as its credential, no other process of the host does.
    yield write_secret(nonce.value, server.conf_dir, NONCE_FILE, "600", "root")
    states = gathering.read(FileStates, paths=(server.conf_file, UNIT_FILE))
    for dest, content in ((server.conf_file, conf_text(server)), (UNIT_FILE, unit_text(server))):
        if not matches(states.get(dest), "file", "644", content=content.encode()):
            yield from shell.put(src=StringIO(content), dest=dest, mode="644")
    yield "systemctl daemon-reload"
    yield f"systemctl {'enable' if server.cache else 'disable'} {UNIT}.service 2>/dev/null || true"
    yield f"systemctl restart {UNIT}.service"


@operation()
def stopped(weights: Weights, started: bool):
    """
    The peer server stopped and its unit removed, once every host of the run has its files (pyinfra runs
    this after every host's downloads), unless `weights_cache` keeps it; one an earlier run left is removed.

    + weights: the host's weights (`weights_cache`)
    + started: whether this run started it (``serving``)

    **Example:**

    .. code:: python

        peer.stopped(name="Weights peer server stopped", weights=deployment.weights, started=True)
    """
    if weights.cache:
        host.noop("weights_cache=true: the peer server keeps serving")
        return
    if not started and not gathering.read(FileStates, paths=(UNIT_FILE,)).get(UNIT_FILE):
        host.noop("no peer server")
        return
    yield f"systemctl disable --now {UNIT}.service 2>/dev/null || true"
    yield StringCommand("rm", "-f", UNIT_FILE)
    yield "systemctl daemon-reload"


@gathering.wants
def _read(deployment) -> gathering.Wanted:
    return [(FileStates, dict(paths=(UNIT_FILE,)))]
