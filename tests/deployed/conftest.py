"""Verify deployed hosts with testinfra, against the inventory they were deployed with.

    pytest tests/deployed --inventory inventory/ct200.py            # real hosts, as deployed
    pytest tests/deployed --inventory lab/inventory.py --limit lab-b200-1
    pytest tests/deployed                                           # the lab: booted and deployed first

Every test taking `target` runs once per inventory host (ids are host names); a target
carries the host's class and resolved deployment (group_data), which the checks compare
the host against. Without --inventory the suite verifies the lab after the session's
`deployed_lab` deploy, and the fault tests (test_catches_faults.py) run too; with
--inventory they are deselected: they break hosts on purpose.
"""

import os

import pytest

from lab import fleet
from operations.gateway.workers import GROUP as GATEWAY
from operations.gateway.workers import serves_model
from operations.nodes.group import members
from tests.conftest import LAB_HOSTS
from tests.deployed.hosts import LAB_INVENTORY, REPO, Target, load_inventory, matches

FAULTS_MARKER = "deployed_faults"


def pytest_configure(config):
    config.addinivalue_line("markers", f"{FAULTS_MARKER}: breaks lab hosts on purpose and restores them "
                                       "(runs only without --inventory)")


def _inventory_args(config) -> tuple[str, str] | None:
    """(inventory path, cwd for its group_data) from --inventory, or None for the session's lab."""
    path = config.getoption("inventory", default=None)
    if path is None:
        return None
    cwd = str(config.invocation_params.dir)
    return os.path.join(cwd, path), cwd  # a relative path is relative to where pytest runs, as for pyinfra


def _selected_hosts(config) -> list[str]:
    """The inventory's hosts that --limit selects; worked out once per session."""
    if not hasattr(config, "_specfleet_hosts"):
        try:
            config._specfleet_hosts = _select_hosts(config)
        except pytest.UsageError as error:
            config._specfleet_hosts = error
    if isinstance(config._specfleet_hosts, Exception):
        raise config._specfleet_hosts
    return config._specfleet_hosts


def _select_hosts(config) -> list[str]:
    limits = config.getoption("limit", default=None) or []
    args = _inventory_args(config)
    if args is None:
        # The lab is booted by a fixture, after collection: its hosts are the spec's.
        hosts = [(h.name, {h.host_class, "lab", "all"}) for h in fleet.parse_spec(LAB_HOSTS)]
        where = f"the lab ({LAB_HOSTS})"
    else:
        try:
            inventory = load_inventory(*args)
        except Exception as error:  # an inventory that does not load is a usage error
            raise pytest.UsageError(f"--inventory {args[0]}: pyinfra cannot load it: {error}") from error
        hosts = [(h.name, set(h.groups) | {"all"}) for h in inventory.values()]
        where = args[0]
    names = [name for name, groups in hosts if matches(name, groups, limits)]
    config._specfleet_gateways = [name for name, groups in hosts if name in names and GATEWAY in groups]
    names = [name for name, groups in hosts if name in names and serves_model(groups)]  # SGLang workers
    if not names and not config._specfleet_gateways:
        raise pytest.UsageError(f"no host of {where} matches --limit {' '.join(limits)}"
                                if limits else f"{where} has no hosts")
    return names


def pytest_generate_tests(metafunc):
    if "target" in metafunc.fixturenames:
        names = _selected_hosts(metafunc.config)
        metafunc.parametrize("target", names, ids=names, indirect=True, scope="session")
    if "gateway_target" in metafunc.fixturenames:  # hosts of the `gateway` group (tests/deployed/test_gateway.py)
        _selected_hosts(metafunc.config)
        names = metafunc.config._specfleet_gateways
        metafunc.parametrize("gateway_target", names, ids=names, indirect=True, scope="session")


def pytest_collection_modifyitems(config, items):
    if config.getoption("inventory", default=None) is None:
        return
    faults = [item for item in items if item.get_closest_marker(FAULTS_MARKER)]
    if faults:
        config.hook.pytest_deselected(items=faults)
        items[:] = [item for item in items if not item.get_closest_marker(FAULTS_MARKER)]


@pytest.fixture(scope="session")
def deployed_inventory(request):
    """The pyinfra inventory under test (for the lab: loaded after the session's deploy)."""
    args = _inventory_args(request.config)
    if args is None:
        request.getfixturevalue("deployed_lab")
        return load_inventory(str(LAB_INVENTORY), str(REPO)), True
    return load_inventory(*args), False


@pytest.fixture(scope="session")
def _targets():
    targets: dict[str, Target] = {}
    yield targets
    for target in targets.values():
        target.close()


@pytest.fixture(scope="session")
def gateway_target(request, deployed_inventory, _targets) -> Target:
    """One host of the inventory's `gateway` group (parametrized by name)."""
    return _target(request, deployed_inventory, _targets)


@pytest.fixture(scope="session")
def target(request, deployed_inventory, _targets) -> Target:
    """One inventory host (parametrized by name): pyinfra host, class, deployment, testinfra host."""
    return _target(request, deployed_inventory, _targets)


def _target(request, deployed_inventory, _targets) -> Target:
    inventory, lab_mode = deployed_inventory
    name = request.param
    if name not in _targets:
        host = inventory.get(name)
        if host is None:
            pytest.fail(f"{name}: expected in the inventory, found only {', '.join(inventory) or 'no hosts'}")
        _targets[name] = Target(name, host, lab_mode, members(inventory.values(), host))
    return _targets[name]
