"""The GPU stages deploy.py calls."""

from deployment.gpu.config import GpuRuntime
from operations.gpu import checks, nvidia


def gpu_runtime(gpu: GpuRuntime) -> None:
    """
    The GPU runtime a host class needs: the driver (with ``install_driver``: NVIDIA's repository, the
    open branch, a reboot into it and the GPUs checked after it), persistence, fabric manager where
    the class has NVSwitch, the NVIDIA packages held, and the fabric checked.

    **Example:**

    .. code:: python

        gpu_runtime(worker.gpu)
    """
    if gpu.nvidia_packages:
        nvidia.repository(name="NVIDIA apt repository", base_url=gpu.nvidia_repo_url)
    if gpu.install_driver:
        nvidia.open_driver(name="NVIDIA open driver", branch=gpu.driver_branch, install=True)
        nvidia.reboot_into_driver(name="Boot into the installed driver")
        checks.checked(name="GPUs as the class says", gpu=gpu)
    nvidia.persistence_daemon(name="NVIDIA persistence daemon")
    if gpu.expected.fabric_manager:
        nvidia.fabric_manager(name="NVIDIA fabric manager")
    if gpu.nvidia_packages:
        nvidia.hold_driver(name="Hold the NVIDIA packages")
    checks.fabric_checked(name="GPU fabric", gpu=gpu)

