"""A host's whole state in one round trip: every fact the deploy's operations compare against,
gathered by one host program (host_scripts/host_state.py) in one Python start.

pyinfra 3 runs a fact's command each time an operation asks for it (it caches nothing), so a no-op
re-run cost one SSH round trip per fact and a Python start per venv, probe and weights check.
Preflight now asks for all of them at once (`gather`); each operation reads its facts through
`read`, which answers from that gathering while no operation has run a command on the host since,
and otherwise (or for a fact the host program could not answer exactly) runs the fact's own command,
as before. Every fact keeps its own command and its own process(): the host program prints for each
the lines that command prints, so the same parser reads them.
"""

import json
import weakref

from pyinfra import host
from pyinfra.context import ctx_host
from pyinfra.api import FactBase
from pyinfra.facts.server import Arch, LinuxDistribution

from operations.deployment import Deployment
from operations.filestate import FileStates
from operations.gpu.facts import NvidiaFabric, NvidiaHost
from operations.gpu.packages import NvidiaPackages
from operations.host_programs import inline

# Per host: the facts its gathering answered, and how many of its operations had run commands then.
_gathered: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


class HostState(FactBase):
    """
    Per requested fact, the lines its own command prints, as host_scripts/host_state.py prints them;
    None where the host program cannot answer exactly. ``gather`` parses each with its fact's process().

    .. code:: python

        [["root "], ["0, NVIDIA B200, 183359, 10.0, 580.95.05, Enabled, Disabled"], None]
    """

    default = list

    def command(self, requests: str) -> str:
        # `|| true`: a host without python3 answers nothing; each fact is then read with its own command.
        return inline("host_state", requests) + " || true"

    def process(self, output):
        return json.loads(output[-1])


def requests(deployment: Deployment, snapshots: dict) -> list[tuple[type[FactBase], dict]]:
    """Every fact a deploy of `deployment` reads on a serving host, with the arguments its operation passes."""
    # Imported here: these modules' operations read through this one.
    from operations.gpu.smoke import GpuSmokeRecord, record_path
    from operations.layout import SystemUser, host_script_paths
    from operations.preflight import LoginUser, WeightsDisk
    from operations.readiness import ServerProbe
    from operations.secrets import UserFileStates
    from operations.service import ServiceState
    from operations.venv import HostPython, Uv, VenvRequirement
    from operations.weights import WeightsState, state_listings

    d = deployment
    wanted = [(LoginUser, {}), *((part, {}) for part in NvidiaHost.PARTS), (NvidiaFabric, {}),
              (FileStates, dict(paths=(d.api_key_file,))),
              (SystemUser, dict(user=d.service_user)),
              (FileStates, dict(paths=(d.install_dir, f"{d.install_dir}/bin", d.config_dir))),
              (UserFileStates, dict(user=d.service_user, paths=(d.hf_home, f"{d.hf_home}/token"))),
              (HostPython, dict(uv=Uv(d.install_dir).binary)),
              (VenvRequirement, dict(path=d.venv, distribution="sglang")),
              (FileStates, dict(paths=host_script_paths(d))),
              (GpuSmokeRecord, dict(path=record_path(d))),
              (ServiceState, dict(unit_file=d.unit_file, env_file=d.env_file, service=d.service_name)),
              (ServerProbe, dict(install_dir=d.install_dir, port=d.port, model=d.served_model_name,
                                 key_file=d.api_key_file, service_user=d.service_user))]
    if d.install_driver or d.expected_gpus.fabric_manager:
        wanted += [(NvidiaPackages, {}), (LinuxDistribution, {}), (Arch, {})]
    if len(snapshots) == len(d.repos):
        wanted += [(WeightsDisk, dict(local_dirs=tuple(r.local_dir for r in d.repos))),
                   (WeightsState, dict(listings=state_listings(d.repos, snapshots)))]
    return wanted


def _key(fact_class: type[FactBase], kwargs: dict) -> tuple:
    return fact_class.__name__, tuple(sorted(kwargs.items()))


def _host_arguments(fact_class: type[FactBase], kwargs: dict) -> dict:
    """What the host program needs besides the fact's own arguments."""
    if fact_class.__name__ == "VenvRequirement":
        from operations.venv import MARKER  # venv reads through this module
        return {**kwargs, "marker": MARKER}
    if fact_class.__name__ == "HostPython":
        from operations.venv import MINIMUM_PYTHON, PYTHON_SOURCE
        return {**kwargs, "minimum": list(MINIMUM_PYTHON), "source": PYTHON_SOURCE}
    return kwargs


def _commands_run(on_host) -> int | None:
    """How many of the host's operations have run commands so far (None outside a pyinfra run)."""
    state = getattr(on_host, "state", None)
    if state is None:
        return None
    return sum(1 for op in state.ops.get(on_host, {}).values() if op.operation_meta.executed)


def _this_host():
    return ctx_host.get()  # the Host itself, not pyinfra's per-greenlet proxy of it


def answered(wanted: list[tuple[type[FactBase], dict]]) -> dict[tuple, object]:
    """Each fact in `wanted` the host program answered, by (fact name, arguments), from one round trip."""
    encoded = [[fact.__name__, _host_arguments(fact, kwargs)] for fact, kwargs in wanted]
    answers = host.get_fact(HostState, requests=json.dumps(encoded, sort_keys=True))
    return {_key(fact_class, kwargs): fact_class().process(lines) if lines else fact_class.default()
            # as pyinfra does: no output, the fact's default
            for (fact_class, kwargs), lines in zip(wanted, answers) if lines is not None}


def gather(wanted: list[tuple[type[FactBase], dict]]) -> None:
    """Read every fact in `wanted` from this host in one round trip, for `read` to answer from."""
    _gathered[_this_host()] = (_commands_run(_this_host()), answered(wanted))


def read(fact_class: type[FactBase], **kwargs):
    """`host.get_fact(fact_class, **kwargs)`, answered from this host's gathering while no operation
    has run a command on the host since."""
    commands_run, found = _gathered.get(_this_host(), (None, {}))
    current = commands_run is not None and commands_run == _commands_run(_this_host())
    if current and _key(fact_class, kwargs) in found:
        return found[_key(fact_class, kwargs)]
    if current and fact_class is NvidiaHost and all(_key(part, {}) in found for part in NvidiaHost.PARTS):
        return {part.__name__: found[_key(part, {})] for part in NvidiaHost.PARTS}
    return host.get_fact(fact_class, **kwargs)
