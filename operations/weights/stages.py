"""The weights stages deploy.py calls."""

from operations.weights import checks, download
from operations.weights.checks import HubState
from operations.weights.config import Weights


def weights_fetched(weights: Weights, hub: HubState) -> None:
    """
    The repos the token may read complete at their commits; a host waiting for a gated repo's terms
    has its other downloads started, then fails naming the terms page.

    **Example:**

    .. code:: python

        weights_fetched(deployment.weights, hub)
    """
    download.earlier_units_removed(name="Earlier download units", weights=weights)
    download.owned(name="Weights owned by the download user", weights=weights)
    download.download(name="Weights", weights=weights, snapshots=hub.snapshots, wait=not hub.pending)
    if hub.pending:
        checks.access_pending(name="Access to gated repos", weights=weights, hub=hub)
