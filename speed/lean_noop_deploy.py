"""What-if for P1 (not the deploy): the no-op's checks gathered by ONE command per host.

Runs the deploy's own controller-side work (resolve, hub snapshots) and, on each host, the
very fact commands the no-op deploy runs (operations/*: GPU facts, WeightsDisk, NvidiaFabric,
VenvRequirement x2, WeightsState, ServiceState, ServerProbe), each once, plus `getent`/`stat`/
`sha1sum` lines standing in for pyinfra's Users/Groups/Os/Directory/File/Sha1File facts,
all in one shell command and one operation. Its time against the floor bounds what merging
the deploy's round trips can buy; it checks nothing.
"""

import shlex

from pyinfra import host
from pyinfra.api import FactBase, operation

from deployment.hosts import host_class_of, resolve
from operations.basics.host_programs import HOST_SCRIPTS
from operations.basics.units import ServiceState
from operations.gpu.facts import NvidiaDriver, NvidiaFabric, NvidiaGpus, NvidiaTopology, RebootPending
from operations.python.virtualenvs import VenvRequirement
from operations.server.readiness import ServerProbe, probe_args
from operations.weights.checks import WeightsDisk, hub_state
from operations.weights.download import WeightsState, state_listings

deployment = resolve(host.data, host_class_of(host.groups))  # the lab's pins are commits: revision directories
d, repos = deployment.engine, deployment.weights.repos
snapshots = hub_state(deployment.weights).snapshots
dirs = tuple(r.local_dir for r in repos)
scripts = " ".join(shlex.quote(f"{d.service.install_dir}/bin/{p.name}") for p in sorted(HOST_SCRIPTS.values()))
SECTIONS = [
    NvidiaGpus().command(), NvidiaTopology().command(), NvidiaDriver().command(), RebootPending().command(),
    WeightsDisk().command(dirs), NvidiaFabric().command(),
    f"getent passwd {d.service.service_user}; id -nG {d.service.service_user}; stat -c '%a %U %G' {d.service.service_home}",
    f"stat -c '%a %U %G' {d.service.hf_home} {d.service.hf_home}/token; sha1sum {d.service.hf_home}/token",
    f"test -e {d.service.api_key_file} && echo api-key || echo no-api-key",
    VenvRequirement().command(d.venv, "sglang"),
    f"stat -c '%a %U %G %n' {scripts}; sha1sum {scripts}",
    WeightsState().command(state_listings(repos, snapshots)),
    *(ServiceState().command(r.unit_file, r.env_file, r.service_name) for r in deployment.replicas),
    *(ServerProbe().command(**probe_args(r)) for r in deployment.replicas),
]


class HostState(FactBase):
    def command(self, sections: tuple[str, ...]) -> str:
        return "; ".join(f"echo '@@ {i}'; {{ {s}; }} 2>&1" for i, s in enumerate(sections))

    def process(self, output):
        return output


@operation()
def lean_noop(sections: tuple[str, ...]):
    lines = host.get_fact(HostState, sections=sections)
    host.noop(f"{len(lines)} lines of state in one command")
    yield from ()


lean_noop(name="All checks, one command", sections=tuple(SECTIONS))
