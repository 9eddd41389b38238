"""specfleet: turn each inventory host into an SGLang server running speculative decoding.

    pyinfra inventory/ct200.py deploy.py            # converge (a second run changes nothing)
    pyinfra inventory/ct200.py deploy.py --dry      # show what would change

Each stage is an operation in operations/; nothing changes on a host until its preflight passes.
A host whose data cannot be deployed, or whose hub checks fail, is refused with one sentence;
the other hosts go on. Hosts of the `gateway` group also get SGLang's model gateway (stage 7)
and Prometheus scraping it and its workers (stage 8); a gateway-only host (in no class group)
has no GPU and gets only those.
"""

from pyinfra import host, inventory

from operations.basics import host_programs, ownership
from operations.basics.knobs import BadHostData
from operations.deployment import preflight
from operations.deployment.config import host_class_of, resolve
from operations.gateway import smg
from operations.gpu import nvidia, smoke
from operations.monitoring import prometheus
from operations.nodes import group, rendezvous
from operations.python import venv
from operations.server import api_key as server_key, readiness, unit as sglang_unit
from operations.weights import download, token

deployment = gateway_data = None
try:
    # Every knob, parsed and checked; a host of a node group with its group's members.
    if smg.serves_model(host.groups):
        deployment = resolve(host.data, host_class_of(host.groups), group.members(inventory, host))
    if smg.GROUP in host.groups:
        gateway_data = smg.resolve_gateway(host.data)
except BadHostData as problem:
    deployment = gateway_data = None
    preflight.refuse(name="Preflight", problem=f"{host.name}: {problem}")

if deployment:
    snapshots, hub_problems, access_pending = preflight.hub_snapshots(deployment)

    # 1. Preflight: hardware, driver, token and repo access, GPU memory, disk, DDTree build, exposure.
    preflight.check(name="Preflight", deployment=deployment, snapshots=snapshots, hub_problems=hub_problems,
                    access_pending=access_pending)
    if deployment.node_group:
        # One server over several nodes: every node reaches rank 0's dist-init port.
        rendezvous.reachable(name="Nodes reach rank 0", deployment=deployment)

# Nothing below is prepared for a host whose hub checks failed: preflight has reported them. A gated
# repo still waiting for access stops only a host that serves (preflight); one serving nothing yet is
# prepared up to its downloads, then fails naming the repo's terms page (stage 5).
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
    ownership.service_user(name="Service user", user=deployment.service_user, home=deployment.service_home)
    ownership.root_directories(name="Root's directories", paths=(deployment.install_dir, f"{deployment.install_dir}/bin",
                                                                   deployment.config_dir))
    token.hf_token(name="Hugging Face token", deployment=deployment)
    api_key = server_key.api_key(name="API key", deployment=deployment)

    # 4. Software: uv, then SGLang in its own virtualenv (the downloads need none: the fetcher is stdlib).
    uv = venv.Uv(deployment.install_dir)
    venv.uv(name="uv", uv=uv, index_url=deployment.pip_index_url)
    venv.requirement(name="SGLang", path=deployment.venv, distribution="sglang",
                     requirement=deployment.sglang_requirement, index_url=deployment.pip_index_url, uv=uv)
    ownership.host_programs_uploaded(name="Host scripts", install_dir=deployment.install_dir)
    smoke.allreduce(name="GPU smoke test", deployment=deployment)

    # 5. Weights, pinned and verified, fetched by units that survive a dropped connection.
    download.download(name="Weights", deployment=deployment, snapshots=snapshots,
                     verify=deployment.verify_weights, wait=not access_pending)
    if access_pending:
        preflight.access_pending(name="Access to gated repos", deployment=deployment, snapshots=snapshots,
                                 pending=access_pending)

if deployment and not hub_problems and not access_pending:  # serving needs every repo's weights
    # 6. The unit (restarted only when its inputs change), then proof that it generates. A worker
    #    behind a gateway leaves it before the restart and comes back once it generates
    #    (rollout.py does the fleet N workers at a time); one that fails readiness is rolled back and stays out.
    inputs = sglang_unit.inputs(deployment, snapshots)
    serves_http = not deployment.node_group or deployment.node_group.serves_http
    routes = smg.routes(inventory, host, deployment.served_model_name)  # none for a rank >= 1
    if routes:
        drained = smg.drain(name="Drain from the gateway", deployment=deployment, routes=routes,
                                restart=sglang_unit.restart_reason(deployment, inputs, [api_key]))
    unit = sglang_unit.configure(name="SGLang service", deployment=deployment, inputs=inputs, restart_when=[api_key])
    ready_timeout_s = deployment.ready_timeout_s or readiness.ready_timeout(
        sum(snapshot.total_bytes for snapshot in snapshots.values()))
    if not serves_http:
        # Rank >= 1 serves no HTTP: it is up and joined. Written first: pyinfra orders operations by
        # their line here, so the ranks' joins come before rank 0's readiness (which is the group's).
        rendezvous.joined(name="Rank joined rank 0", deployment=deployment, timeout_s=ready_timeout_s)
    else:
        readiness.ready(name="SGLang generates", deployment=deployment, restarted=unit, timeout_s=ready_timeout_s)
    if routes:
        smg.rejoin(name="Back in the gateway", deployment=deployment, routes=routes, drained=drained)

# 7. The gateway, after every worker's readiness (every host passes `workers_done`, which orders the
#    stage after the workers'): smg in its own virtualenv, its key (0640, root's), its unit, the inventory's workers registered.
if any(smg.GROUP in other.groups for other in inventory):
    smg.workers_done(name="Workers done")
if gateway_data:
    g = gateway_data
    ownership.service_user(name="Gateway user", user=g.user, home=g.home)
    gateway_key = smg.api_key(name="Gateway API key", gateway=g)
    gateway_uv = venv.Uv(g.install_dir)
    if not deployment:  # a worker has it from stage 4
        venv.uv(name="uv", uv=gateway_uv, index_url=g.pip_index_url)
    smg_venv = venv.requirement(name="smg", path=g.venv, distribution="smg", requirement=g.requirement,
                           index_url=g.pip_index_url, uv=gateway_uv)
    launcher = ownership.host_programs_uploaded(name="Gateway scripts", install_dir=g.install_dir,
                                                programs=host_programs.of_subject("gateway"), owner="root")
    gateway_unit = smg.configure(name="Gateway service", gateway=g, inputs=g.requirement,
                                     restart_when=[gateway_key, smg_venv, launcher])
    smg.register_workers(name="Gateway workers", gateway=g, wanted=smg.workers(inventory, host, g.model),
                             restarted=gateway_unit)

    # 8. Prometheus (Debian's package): its arguments and targets written before the package (its first
    #    start listens on loopback), the workers' key, then every target checked up.
    try:
        m = prometheus.resolve_monitoring(host.data)
    except BadHostData as problem:
        preflight.refuse(name="Prometheus", problem=f"{host.name}: {problem}")
    else:
        targets = prometheus.scrape_targets(host.name, g, smg.workers(inventory, host, g.model))
        prometheus_args = prometheus.arguments(name="Prometheus arguments", monitoring=m)
        prometheus_config = prometheus.scrape_config(name="Prometheus targets", monitoring=m, targets=targets)
        prometheus_package = prometheus.package(name="Prometheus package")
        prometheus.scrape_key(name="Prometheus scrape key", monitoring=m)
        prometheus_unit = prometheus.service(name="Prometheus service", restart_when=[prometheus_args, prometheus_package],
                                             reload_when=[prometheus_config])
        prometheus.targets_up(name="Prometheus targets up", monitoring=m, targets=targets,
                              changed=[prometheus_config, prometheus_unit])
