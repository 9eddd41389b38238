"""The weights stages deploy.py calls."""

from pyinfra import host, inventory

from deployment.weights.config import Weights
from operations.basics import ownership
from operations.weights import checks, download, peer, sharing
from operations.weights.checks import HubState


def weights_fetched(weights: tuple[Weights, ...], hubs: list[HubState], fleet_workers) -> None:
    """
    Each deployment's repos that the token may read complete at their commits; a host waiting for a gated
    repo's terms has its other downloads started, then fails naming the terms page. Where other hosts of
    the run hold the same revision and one of them lacks it, the host serves its revisions to them while
    the downloads run (peer.py), and each file comes from the hub once (sharing.py, deployment/weights/fanout.py).
    `fleet_workers`: the run's worker hosts as deployment/gateway/membership.py resolved them.

    **Example:**

    .. code:: python

        weights_fetched(tuple(d.weights for d in deployments), hubs, fleet.workers)
    """
    part = sharing.host_part(inventory, fleet_workers, host.name, weights)
    if part:
        peer.package(name="Weights peer server package")
        peer.serving(name="Weights peer server", server=part.server, nonce=part.run.nonce)
        ownership.marked(name="The peer server's directory", paths=(part.server.conf_dir,))
        sharing.reachable(name="Weights peers reachable", part=part)
    for w, hub in host.loop(list(zip(weights, hubs))):
        download.earlier_units_removed(name="Earlier download units", weights=w)
        download.owned(name="Weights owned by the download user", weights=w)
        download.download(name="Weights", weights=w, snapshots=hub.snapshots, wait=not hub.pending,
                          shared=part.spec_of if part else None)
        if hub.pending:
            checks.access_pending(name="Access to gated repos", weights=w, hub=hub)
    if any(w.fanout for w in weights):
        # After every host's downloads: pyinfra runs an operation on every host before the next.
        peer.stopped(name="Weights peer server stopped", weights=weights[0], started=bool(part))
