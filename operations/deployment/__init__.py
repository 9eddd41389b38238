"""The deployment one host gets: every subject's configuration, resolved from the host's data at once.

`resolve()` is the only reader of a worker's host data: every knob of every subject is parsed and
checked here (through each subject's own `resolve`, with operations/basics/knobs.py), before any
host is touched, and each operation then receives the slice it needs (`Deployment.gpu`, `.weights`,
`.server`, ...). A value that cannot be deployed raises BadHostData: one line naming the knob, the
value and what is accepted.
"""

import re
from dataclasses import dataclass, replace
from typing import Any

from operations.basics import knobs
from operations.basics.knobs import BadHostData
from operations.gpu import config as gpu_config
from operations.gpu.config import GpuRuntime
from operations.gpu.smoke import SmokeTest
from operations.nodes import group as nodes
from operations.nodes.group import NodeGroup
from operations.server import config as server_config
from operations.server.config import Server
from operations.weights import config as weights_config
from operations.weights.config import Weights

COMMIT = re.compile(r"[0-9a-f]{40}")  # a pinned revision; anything else is a branch or tag

# The host classes. Each is an inventory group, and group_data/<class>.py says what its
# GPUs must be (`expected_gpus`) and how SGLang is tuned for them (`sglang_tuning`).
# The value is the class's short name (lab host names such as lab-pcie-1, `lab up --hosts`).
HOST_CLASSES = {"rtx_pro_6000_pcie": "pcie", "b200_nvlink": "b200", "b300_nvlink": "b300"}


@dataclass(frozen=True)
class Deployment:
    """Everything one worker host gets, as each subject's slice."""

    host_class: str
    gpu: GpuRuntime  # driver, fabric, GPU checks
    smoke: SmokeTest  # the GPU smoke test before SGLang starts
    weights: Weights  # the target's and drafter's weights
    server: Server  # the SGLang unit
    node_group: NodeGroup | None  # a server spanning several hosts: this host's part
    allow_branch_revisions: bool  # deploy what a branch or git ref points at now, with a warning


def resolve(data: Any, host_class: str, node_members: dict | None = None) -> Deployment:
    """Resolve `host.data` (or any object with the same attributes) for a host of `host_class`;
    `node_members`: its node group's hosts (`nodes.members(inventory, host)`), if it is in one."""
    profiles = data.profiles if isinstance(data.profiles, dict) else {}
    if data.profile not in profiles:
        raise BadHostData(f"profile={data.profile!r} is not one of {', '.join(sorted(profiles))} "
                          "(group_data/all.py profiles)")
    knobs.matching("profile", data.profile, knobs.PROFILE_NAME, "a profile name of letters, digits and _.- "
                   "(a key of group_data/all.py profiles)")
    try:
        return _resolve(data, host_class, data.profile, profiles[data.profile], node_members)
    except (KeyError, TypeError, AttributeError, IndexError) as error:
        raise BadHostData(f"group data for profile {data.profile!r} on class {host_class} is incomplete or "
                          f"malformed ({type(error).__name__}: {error}): compare it with group_data/all.py "
                          f"and group_data/{host_class}.py") from None


def _resolve(data: Any, host_class: str, profile_name: str, profile: dict, node_members: dict | None) -> Deployment:
    gpu = gpu_config.resolve(data, host_class)
    weights_dir = knobs.path("weights_dir", data.weights_dir)
    server = server_config.resolve(data, host_class, profile_name, profile,
                                   *(weights_config.local_dir(weights_dir, profile[role]["repo"])
                                     for role in weights_config.ROLES))
    server = replace(server, after_fabric_manager=gpu.expected.fabric_manager)
    weights = weights_config.resolve(data, profile_name, profile, weights_dir, owner=server.service_user,
                                     hf_home=server.hf_home, config_dir=server.config_dir,
                                     install_dir=server.install_dir)
    group = nodes.group(data, host_class, profile_name, gpu.expected.count, server.port, node_members)
    if group is not None:
        # One server over the group's nodes: TP over all their GPUs, the network between them named.
        server = replace(server, tp_size=group.tp_size, env={**server.env, **group.env()},
                         node_args=tuple(group.server_args()))
    if getattr(data, "gpu_smoke_engine", None) is not None:
        raise BadHostData("gpu_smoke_engine is not accepted: the GPU smoke test always runs torch.distributed "
                          "with NCCL from the SGLang venv; remove it")
    smoke = SmokeTest(expected=gpu.expected, venv=server.venv, install_dir=server.install_dir, env=server.env,
                      build=server.sglang_requirement, user=server.service_user,
                      timeout_s=knobs.integer("gpu_smoke_timeout_s", data.gpu_smoke_timeout_s, minimum=10))
    return Deployment(host_class=host_class, gpu=gpu, smoke=smoke, weights=weights, server=server, node_group=group,
                      allow_branch_revisions=knobs.boolean("allow_branch_revisions", data.allow_branch_revisions))


def host_class_of(group_names) -> str:
    """The one class group (group_data/<class>.py) an inventory puts a host in."""
    classes = sorted({name for name in group_names if name in HOST_CLASSES})
    if len(classes) != 1:
        raise BadHostData(f"the host is in {' and '.join(classes) if classes else 'no'} class group"
                          f"{'s' if len(classes) > 1 else ''}: put it in exactly one of the inventory "
                          f"groups {', '.join(HOST_CLASSES)}")
    return classes[0]
