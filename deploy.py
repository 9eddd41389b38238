"""specfleet: turn each inventory host into an SGLang server running speculative decoding.

    pyinfra inventory/ct200.py deploy.py            # converge (a second run changes nothing)
    pyinfra inventory/ct200.py deploy.py --dry      # show what would change

Each stage is an operation in operations/; nothing changes on a host until its preflight passes.
A host whose data cannot be deployed, or whose hub checks fail, is refused with one sentence;
the other hosts go on. Hosts of the `gateway` group also get SGLang's model gateway, last
(stage 7); a gateway-only host (in no class group) has no GPU and gets only that.
"""

from pyinfra import host, inventory

from operations import gateway, layout, preflight, readiness, secrets, service, venv, weights
from operations.deployment import BadHostData, host_class_of, resolve
from operations.gpu import nvidia, smoke

deployment = None
try:
    if gateway.serves_model(host.groups):
        deployment = resolve(host.data, host_class_of(host.groups))  # every knob, parsed and checked
except BadHostData as problem:
    preflight.refuse(name="Preflight", problem=f"{host.name}: {problem}")

if deployment:
    snapshots, hub_problems = preflight.hub_snapshots(deployment)

    # 1. Preflight: hardware, driver, token and repo access, GPU memory, disk, DDTree build, exposure.
    preflight.check(name="Preflight", deployment=deployment, snapshots=snapshots, hub_problems=hub_problems)

# Nothing below is prepared for a host whose hub checks failed: preflight has reported them.
if deployment and not hub_problems:
    # 2. The GPU runtime the class needs: the driver (install_driver) from NVIDIA's repository,
    # the host rebooted into it and its GPUs checked; persistence; fabric manager; all held.
    nvidia_packages = deployment.install_driver or deployment.expected_gpus.fabric_manager
    if nvidia_packages:
        nvidia.repository(name="NVIDIA apt repository", base_url=deployment.nvidia_repo_url)
    if deployment.install_driver:
        nvidia.open_driver(name="NVIDIA open driver", branch=deployment.driver_branch, install=True)
        nvidia.reboot_into_driver(name="Boot into the installed driver")
        preflight.gpus(name="GPUs as the class says", deployment=deployment)
    nvidia.persistence_daemon(name="NVIDIA persistence daemon")
    if deployment.expected_gpus.fabric_manager:
        nvidia.fabric_manager(name="NVIDIA fabric manager")
    if nvidia_packages:
        nvidia.hold_driver(name="Hold the NVIDIA packages")
    preflight.fabric(name="GPU fabric", deployment=deployment)

    # 3. Service user, root's directories and secrets (files with their final mode).
    layout.service_user(name="Service user", user=deployment.service_user, home=deployment.service_home)
    layout.root_directories(name="Root's directories", deployment=deployment)
    secrets.hf_token(name="Hugging Face token", deployment=deployment)
    api_key = secrets.api_key(name="API key", deployment=deployment)

    # 4. Software: huggingface_hub for the downloads, SGLang in its own virtualenv.
    venv.requirement(name="huggingface_hub", path=deployment.tools_venv, distribution="huggingface_hub",
                     requirement=deployment.huggingface_hub_requirement, index_url=deployment.pip_index_url)
    venv.requirement(name="SGLang", path=deployment.venv, distribution="sglang",
                     requirement=deployment.sglang_requirement, index_url=deployment.pip_index_url)
    layout.host_scripts(name="Host scripts", deployment=deployment)
    smoke.allreduce(name="GPU smoke test", deployment=deployment)

    # 5. Weights, pinned and verified, fetched by units that survive a dropped connection.
    weights.download(name="Weights", deployment=deployment, snapshots=snapshots,
                     verify=deployment.verify_weights)

    # 6. The unit (restarted only when its inputs change), then proof that it generates.
    unit = service.configure(name="SGLang service", deployment=deployment,
                             inputs=service.inputs(deployment, snapshots), restart_when=[api_key])
    readiness.ready(name="SGLang generates", deployment=deployment, restarted=unit,
                    timeout_s=deployment.ready_timeout_s or readiness.ready_timeout(
                        sum(snapshot.total_bytes for snapshot in snapshots.values())))

# 7. The gateway, after every worker's readiness (every host passes `workers_done`, which orders the
#    stage after the workers'): smg in its own virtualenv, its key (0640, root's), its unit, the inventory's workers registered.
if any(gateway.GROUP in other.groups for other in inventory):
    gateway.workers_done(name="Workers done")
if gateway.GROUP in host.groups:
    g = gateway.resolve_gateway(host.data)
    layout.service_user(name="Gateway user", user=g.user, home=g.home)
    gateway_key = gateway.api_key(name="Gateway API key", gateway=g)
    smg = venv.requirement(name="smg", path=g.venv, distribution="smg", requirement=g.requirement,
                           index_url=g.pip_index_url)
    launcher = gateway.scripts(name="Gateway scripts", gateway=g)
    gateway_unit = gateway.configure(name="Gateway service", gateway=g, inputs=g.requirement,
                                     restart_when=[gateway_key, smg, launcher])
    gateway.register_workers(name="Gateway workers", gateway=g, wanted=gateway.workers(inventory, host, g.model),
                             restarted=gateway_unit)
