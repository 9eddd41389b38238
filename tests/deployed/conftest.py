"""Verify deployed hosts with testinfra, against the deployment their group data describes.

    pytest tests/deployed --inventory inventory/ct200.py              # the hosts of the inventory you deployed
    pytest tests/deployed --inventory inventory/ct200.py --sudo       # a login other than root, through sudo
    pytest tests/deployed --hosts ssh://root@gpu-7,ssh://root@gpu-8  # testinfra's own way to name hosts
    pytest tests/deployed --inventory lab/inventory.py --limit lab-b200-1   # the running lab, as deployed
    pytest tests/deployed --lab                                       # boot the lab, deploy it, verify it

Every test taking `target` runs once per host (ids are host names); a target carries the host's class and
resolved deployment (group data, SPECFLEET_SITE included), which the checks compare the host against.
With --inventory a host's data is the inventory's, as `pyinfra INVENTORY deploy.py` gives it; with --hosts
each host's class is read from its GPUs (as `python -m tools.gpu classify` reads it) and its data is
that class's group data. With neither, and without --lab, the suite refuses in one line: it never boots a
lab on a machine that asked to verify real hosts. With --lab the fault tests (test_catches_faults.py) run
too; otherwise they are deselected: they break hosts on purpose.
"""

import os
import tempfile

import pytest
import testinfra

from lab import fleet
from deployment.roles import GATEWAY, serves_model
from tools.gpu.classify import host_class_for, load_class_expectations
from deployment.gpu.products import interconnect_by_product
from deployment.nodes.group import members
from operations.gpu.facts import NvidiaGpus, NvidiaTopology
from tests.conftest import LAB_HOSTS
from tests.deployed.hosts import LAB_INVENTORY, REPO, Target, load_inventory, matches

FAULTS_MARKER = "deployed_faults"
WHICH_HOSTS = ("tests/deployed verifies deployed hosts: name them with --inventory FILE (the inventory you deployed "
               "with) or testinfra's --hosts ssh://USER@HOST,...; --lab boots, deploys and verifies the lab instead")


def pytest_configure(config):
    config.addinivalue_line("markers", f"{FAULTS_MARKER}: breaks lab hosts on purpose and restores them "
                                       "(runs only with --lab)")


def _mode(config) -> str | pytest.UsageError:
    """"inventory", "hosts" or "lab", as the command line asks; a UsageError for none or several."""
    asked = [mode for mode, given in (("inventory", config.getoption("inventory", default=None)),
                                      ("hosts", getattr(config.option, "hosts", None)),
                                      ("lab", config.getoption("lab", default=False))) if given]
    if len(asked) > 1:
        return pytest.UsageError(f"tests/deployed: {' and '.join('--' + mode for mode in asked)} each name the hosts "
                                 "to verify: give one")
    return asked[0] if asked else pytest.UsageError(WHICH_HOSTS)


def _inventory_args(config) -> tuple[str, str] | None:
    """(inventory path, cwd for its group_data) from --inventory or --hosts, or None for the session's lab."""
    mode = _mode(config)
    if mode == "inventory":
        cwd = str(config.invocation_params.dir)
        # A relative path is relative to where pytest runs, as for pyinfra.
        return os.path.join(cwd, config.getoption("inventory")), cwd
    if mode == "hosts":
        return _hosts_inventory(config), str(REPO)
    return None


def _testinfra_hosts(config) -> dict:
    """testinfra's hosts from --hosts (with its --ssh-config, --ssh-identity-file, --sudo...), by host name."""
    if not hasattr(config, "_specfleet_testinfra"):
        o = config.option
        extra = {"ssh_extra_args": o.ssh_extra_args} if o.ssh_extra_args else {}
        hosts = testinfra.get_hosts(o.hosts.split(","), connection=o.connection, ssh_config=o.ssh_config,
                                    ssh_identity_file=o.ssh_identity_file, sudo=o.sudo, sudo_user=o.sudo_user,
                                    **extra)
        config._specfleet_testinfra = {h.backend.get_hostname(): h for h in hosts}
    return config._specfleet_testinfra


def classify(infra) -> str:
    """A host's class from its GPUs, read with the deploy's own facts (nvidia-smi through testinfra)."""
    gpus = infra.run(NvidiaGpus().command()).stdout.splitlines()
    topology = infra.run(NvidiaTopology().command()).stdout.splitlines()
    found = NvidiaGpus().process(gpus) if gpus else []
    names = [gpu["name"] for gpu in found] if isinstance(found, list) else []  # a dict: nvidia-smi failed
    interconnect = NvidiaTopology().process(topology)["interconnect"] if topology else None
    if interconnect in (None, "unknown"):
        interconnect = interconnect_by_product(names) or interconnect
    return host_class_for(names, interconnect, load_class_expectations())


def _hosts_inventory(config) -> str:
    """A pyinfra inventory file holding the --hosts hosts, each in the class its GPUs tell (written once)."""
    if not hasattr(config, "_specfleet_hosts_inventory"):
        groups: dict[str, list] = {}
        for name, infra in _testinfra_hosts(config).items():
            try:
                host_class = classify(infra)
            except Exception as error:  # no connection, no login: nothing to verify
                raise pytest.UsageError(f"--hosts {name}: testinfra cannot run a command there "
                                        f"({type(error).__name__}: {' '.join(str(error).split())[:200]})") from None
            if host_class == "unknown":
                raise pytest.UsageError(f"--hosts {name}: its GPUs match no class of group_data (nvidia-smi found "
                                        "none, or none the classes expect): verify it through the inventory you "
                                        "deployed it with (--inventory FILE)")
            groups.setdefault(host_class, []).append((name, {}))
        path = os.path.join(tempfile.mkdtemp(prefix="specfleet-hosts-"), "hosts.py")
        with open(path, "w") as inventory:
            inventory.write("".join(f"{group} = {hosts!r}\n" for group, hosts in groups.items()))
        config._specfleet_hosts_inventory = path
    return config._specfleet_hosts_inventory


def _selected_hosts(config) -> list[str]:
    """The hosts to verify (--limit applied); worked out once per session. [] when the command line names
    none (pytest_collection_modifyitems then refuses in one line)."""
    if not hasattr(config, "_specfleet_hosts"):
        try:
            config._specfleet_hosts = _select_hosts(config)
        except pytest.UsageError as error:
            config._specfleet_hosts = error
    if isinstance(config._specfleet_hosts, Exception):
        config._specfleet_gateways = []
        return []
    return config._specfleet_hosts


def _select_hosts(config) -> list[str]:
    mode = _mode(config)
    if isinstance(mode, Exception):
        raise mode
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
        where = args[0] if mode == "inventory" else f"--hosts {config.option.hosts}"
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
    here = os.path.dirname(__file__)
    if not any(str(item.path).startswith(here + os.sep) for item in items):
        return
    _selected_hosts(config)
    if isinstance(config._specfleet_hosts, Exception):
        raise config._specfleet_hosts  # one line, before anything runs: name the hosts, or --lab
    if _mode(config) == "lab":
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
        o = request.config.option
        _targets[name] = Target(name, host, lab_mode, members(inventory.values(), host), sudo=o.sudo,
                                sudo_user=o.sudo_user)
        if _mode(request.config) == "hosts":  # testinfra's own connection, as its options made it
            _targets[name].use(_testinfra_hosts(request.config)[name])
    return _targets[name]
