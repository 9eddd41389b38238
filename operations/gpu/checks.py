"""Check a host's GPU facts against its class's expectations (group_data/<class>.py `expected_gpus`).

Each problem is one sentence naming the host, what was expected, what was found, and what
to do. Hardware/driver checks run in preflight; fabric/runtime checks run after the deploy
has set up fabric manager, so they are a separate function.
"""

from __future__ import annotations

from pyinfra import host
from pyinfra.api import operation

from deployment.gpu import products
from deployment.gpu.config import GpuExpectations, GpuRuntime
from operations.basics import gathering
from operations.basics.failing import fail_host
from operations.gpu import packages
from operations.gpu.facts import NvidiaFabric, NvidiaHost, unreadable
from operations.gpu.nvidia import host_release


def models_of(gpus: list[dict]) -> dict[str, int]:
    """{GPU model: how many}, in the order nvidia-smi lists them (a model nvidia-smi did not name is '?')."""
    models: dict[str, int] = {}
    for gpu in gpus:
        models[gpu.get("name") or "?"] = models.get(gpu.get("name") or "?", 0) + 1
    return models


def _driver_major(version: str | None) -> int | None:
    return int(version.split(".")[0]) if version and version.split(".")[0].isdigit() else None


def check_gpu_class(
    host_name: str,
    class_name: str,
    expected: GpuExpectations,
    gpus: list[dict] | None,
    topology: dict | None,
    driver: dict | None,
    reboot_pending: list[str] | None = None,
    install_driver: bool = False,
) -> list[str]:
    """Return the problems that keep this host from serving as `class_name` (empty: fits).

    `gpus`, `topology`, `driver`, `reboot_pending` are the values of the facts NvidiaGpus,
    NvidiaTopology, NvidiaDriver and RebootPending (None where nvidia-smi is missing).
    `install_driver`: the deploy installs the driver branch itself, so the loaded driver's
    branch and module kind are not a reason to stop.
    """
    where = f"{host_name}: expected"
    tag = f"(class {class_name})"
    if gpus is None:
        return [f"{where} {expected.count} GPUs {tag}, found no nvidia-smi: install the NVIDIA driver "
                f"(branch {expected.driver_min}+, open kernel module), or let the deploy install it and reboot "
                "the host with `--data install_driver=true`"]
    problems = []
    if failed := unreadable(gpus):
        # The GPUs are unknown, not missing: nothing else nvidia-smi said can be judged either.
        return [f"{where} {expected.count} GPUs {tag}, found nvidia-smi unable to read them "
                f"(exit code {failed['exit_code']}: {failed['message']}): {failed['cause']}: {failed['fix']}"]
    if not gpus and reboot_pending:
        return [f"{where} {expected.count} GPUs {tag}, found nvidia-smi unable to read them "
                f"({'; '.join(reboot_pending)}): reboot the host so the new driver loads"]

    patterns = expected.name_patterns
    matching = [gpu for gpu in gpus if products.named(gpu.get("name"), patterns)]
    if len(matching) != expected.count or len(gpus) != expected.count:
        names = sorted({gpu.get("name") or "?" for gpu in gpus}) or ["none"]
        problems.append(
            f"{where} {expected.count} GPUs matching {' or '.join(patterns)} {tag}, found {len(gpus)} "
            f"({len(matching)} matching; names: {', '.join(names)}): check `nvidia-smi -L`; "
            "a missing GPU usually needs a reseat or an RMA, a wrong model means this host belongs to another class"
        )
    models = models_of(gpus)
    if len(models) > 1:
        problems.append(
            f"{where} one GPU model {tag}, found {len(models)}: "
            + ", ".join(f"{count}x {name}" for name, count in models.items())
            + ": tensor parallelism splits the model evenly and runs at the slowest card's pace, so a host "
            "serves with one model only: move the odd cards, or serve from the matching ones in another class"
        )
    mig = [gpu for gpu in gpus if gpu.get("mig_mode") == "Enabled"]
    if mig:
        problems.append(
            f"{where} MIG disabled {tag}, found it enabled on GPU "
            + ", ".join(str(gpu.get("index")) for gpu in mig)
            + ": SGLang would see MIG instances (each a slice of the card's memory), not the cards: "
            "`nvidia-smi -i <index> -mig 0` on each, then reset the GPUs or reboot"
        )
    small = [gpu for gpu in matching if (gpu.get("memory_total_mib") or 0) < expected.min_memory_mib]
    if small:
        problems.append(
            f"{where} at least {expected.min_memory_mib} MiB per GPU {tag}, found "
            + ", ".join(f"GPU {gpu.get('index')} with {gpu.get('memory_total_mib')} MiB" for gpu in small)
            + ": check `nvidia-smi -q -d MEMORY` for MIG slices or a different SKU"
        )
    caps = sorted({gpu.get("compute_capability") or "unknown" for gpu in matching})
    if matching and caps != [expected.compute_capability]:
        problems.append(
            f"{where} compute capability {expected.compute_capability} {tag}, found {', '.join(caps)}: "
            "the attention backends are chosen per architecture, so assign this host to its own class"
        )
    problems += _check_topology(where, tag, expected, topology)
    if not install_driver:
        problems += _check_driver(where, tag, expected, driver)
    if reboot_pending:
        problems.append(f"{host_name}: a reboot is pending ({'; '.join(reboot_pending)}): reboot before serving")
    return problems


def _check_topology(where: str, tag: str, expected: GpuExpectations, topology: dict | None) -> list[str]:
    wanted = expected.interconnect
    if topology is None:
        return [f"{where} {wanted} interconnect {tag}, found no `nvidia-smi topo -m` output: check the driver"]
    if topology["degraded"]:
        gpus = ", ".join(f"GPU {gpu}" for gpu in topology["gpus_without_nvlink"])
        return [
            f"{where} NVLink between every GPU pair {tag}, found a degraded board: {gpus} reach the others "
            "over PCIe only: check `nvidia-smi nvlink -s` and the fabric manager log; a GPU without links "
            "usually needs a reseat or an RMA"
        ]
    if topology["interconnect"] != wanted:
        kinds = ", ".join(sorted({link or "?" for link in topology["links"].values()})) or "no GPU pairs"
        return [
            f"{where} {wanted} interconnect {tag}, found {topology['interconnect']} ({kinds}): "
            "check `nvidia-smi topo -m`; this host may belong to another class"
        ]
    return []


def _check_driver(where: str, tag: str, expected: GpuExpectations, driver: dict | None) -> list[str]:
    if driver is None or not driver.get("version"):
        return [f"{where} NVIDIA driver branch {expected.driver_min}+ {tag}, found none loaded: "
                "install the driver (open kernel module) and reboot"]
    problems = []
    major, wanted = _driver_major(driver["version"]), expected.driver_min
    if major is None or major < wanted:
        problems.append(
            f"{where} NVIDIA driver branch {wanted}+ {tag}, found {driver['version']} "
            f"(CUDA {driver.get('cuda_version') or 'unknown'}): install driver branch {wanted} or newer "
            "(set install_driver to let the deploy do it) and reboot"
        )
    minors = driver.get("gpu_minor_numbers") or []
    if unknown := [str(index) for index, minor in enumerate(minors) if minor is None]:
        problems.append(
            f"{where} a device minor number for every GPU {tag}, found none in `nvidia-smi -q` for GPU "
            f"{', '.join(unknown)}: each replica's unit allows its own GPUs' device nodes alone, by that number; "
            "check the driver (`nvidia-smi -q` shows a `Minor Number` for each GPU)"
        )
    if expected.open_kernel_module and driver.get("open_kernel_module") is False:
        problems.append(
            f"{where} the open NVIDIA kernel module {tag}, found the proprietary one: install the open driver of "
            f"branch {max(major or 0, wanted)} (set install_driver to let the deploy do it) and reboot; these GPUs "
            "do not work with the proprietary module"
        )
    return problems


def check_fabric(host_name: str, class_name: str, expected: GpuExpectations, fabric: dict | None) -> list[str]:
    """Return runtime problems with NVSwitch/fabric manager for the NvidiaFabric fact's value.

    NVSwitch classes need fabric manager active and every GPU's fabric State Completed;
    on the PCIe class fabric manager must not be enabled (it fails without NVSwitch).
    """
    where, tag = f"{host_name}: expected", f"(class {class_name})"
    if fabric is None:
        return [f"{where} fabric state {tag}, found nothing readable: check that the driver is loaded"]
    manager = fabric["units"].get("nvidia-fabricmanager", {})
    if not expected.fabric_manager:
        if manager.get("enabled") == "enabled" or manager.get("active") == "active":
            return [
                f"{where} no nvidia-fabricmanager on a board without NVSwitch {tag}, found it "
                f"{manager.get('enabled')}/{manager.get('active')}: `systemctl disable --now nvidia-fabricmanager`"
            ]
        return []
    problems = []
    if not fabric["nvswitch"]:
        problems.append(f"{where} NVSwitch devices in /proc/driver/nvidia-nvswitch/devices {tag}, found none: "
                        "check that the nvidia-nvswitch driver loaded (`dmesg | grep -i nvswitch`)")
    if manager.get("active") != "active":
        problems.append(
            f"{where} nvidia-fabricmanager active {tag}, found it {manager.get('active') or 'not installed'}: "
            "check `journalctl -u nvidia-fabricmanager`; its version must equal the driver's exactly"
        )
    pending = [gpu for gpu in fabric["gpus"] if gpu.get("fabric_state") != "Completed" or gpu.get("fabric_status") != "Success"]
    if pending:
        problems.append(
            f"{where} every GPU's fabric State Completed / Status Success {tag}, found "
            + ", ".join(f"{gpu.get('pci_bus_id')} {gpu.get('fabric_state')}/{gpu.get('fabric_status')}" for gpu in pending)
            + ": CUDA fails with error 802 until it completes; restart nvidia-fabricmanager and check its log"
        )
    return problems


def hardware_problems(gpu: GpuRuntime) -> tuple[list[str], list[dict] | None]:
    """Preflight's GPU rules on this host (problems, the GPUs read; None when none could be read): the
    class's hardware and driver; a host without a driver that the deploy will give one is checked on its
    PCI bus and OS release."""
    gpu_host = gathering.read(NvidiaHost)
    gpus = gpu_host["NvidiaGpus"]
    if gpus is None and gpu.install_driver:
        # No driver yet: the deploy lays it down; the GPUs are checked after its reboot (`checked`).
        _release, release_problem = host_release()
        return packages.before_driver_problems(host.name, release_problem, host.get_fact(packages.FreshHost),
                                               gpu.host_class, gpu.expected), gpus
    return check_gpu_class(host.name, gpu.host_class, gpu.expected, gpus, gpu_host["NvidiaTopology"],
                           gpu_host["NvidiaDriver"], gpu_host["RebootPending"],
                           install_driver=gpu.install_driver), None if unreadable(gpus) else gpus


@operation()
def checked(gpu: GpuRuntime):
    """
    Check the GPUs against the host's class once the driver the deploy installed is loaded
    (preflight could not read them without a driver).

    + gpu: the host's GPU runtime

    **Example:**

    .. code:: python

        checks.checked(name="GPUs as the class says", gpu=worker.gpu)
    """
    gpu_host = host.get_fact(NvidiaHost)
    problems = check_gpu_class(host.name, gpu.host_class, gpu.expected, gpu_host["NvidiaGpus"],
                               gpu_host["NvidiaTopology"], gpu_host["NvidiaDriver"], gpu_host["RebootPending"])
    if problems:
        yield fail_host(problems)
    else:
        host.noop(f"{len(gpu_host['NvidiaGpus'])}x {gpu_host['NvidiaGpus'][0]['name']} on driver "
                  f"{gpu_host['NvidiaDriver']['version']}, as {gpu.host_class} needs")


@operation()
def fabric_checked(gpu: GpuRuntime):
    """
    Check the GPU fabric after the deploy set it up: NVSwitch classes need fabric manager active
    and every GPU's fabric Completed; the PCIe class must not run fabric manager.

    + gpu: the host's GPU runtime

    **Example:**

    .. code:: python

        checks.fabric_checked(name="GPU fabric", gpu=worker.gpu)
    """
    problems = check_fabric(host.name, gpu.host_class, gpu.expected, gathering.read(NvidiaFabric))
    if problems:
        yield fail_host(problems)
    else:
        host.noop("GPU fabric as the class needs it")
