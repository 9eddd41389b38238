"""What an inventory host is to the fleet, read from its groups: a worker (an SGLang server, in one class
group), a gateway host (in the `gateway` group), or both. The deploy, rollout.py, pin.py, status and the
gateway's membership ask here."""

from deployment import site_data

GATEWAY = "gateway"  # the inventory group of gateway hosts


def serves_model(groups) -> bool:
    """In a class group: an SGLang worker (a gateway-only host is in none and skips every GPU stage)."""
    classes = site_data.host_classes()
    return any(group in classes for group in groups)


def is_gateway(groups) -> bool:
    """In the `gateway` group: the host runs smg for its model (and may serve it too)."""
    return GATEWAY in groups
