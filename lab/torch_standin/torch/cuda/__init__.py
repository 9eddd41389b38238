# LAB STAND-IN, NOT PyTorch's torch.cuda (see torch/__init__.py).
"""torch.cuda as the smoke test uses it: the host's GPUs are the GPU profile's (torch/_gpus.py), and
CUDA fails where it would on them (no driver, a driver/library mismatch, NVSwitch fabric not ready)."""

from torch import _gpus
from torch.cuda import nccl  # noqa: F401  (torch.cuda.nccl.version())

_current = 0
_initialized = False


def _lazy_init() -> None:
    """CUDA's first use in the process: the driver must answer, as cuInit does."""
    global _initialized
    if not _initialized:
        _gpus.cuda_init()
        _initialized = True


def is_available() -> bool:
    try:
        _gpus.cuda_init()
    except RuntimeError:
        return False
    return True


def device_count() -> int:
    try:
        return len(_gpus.profile()["gpus"])
    except RuntimeError:
        return 0


def set_device(device) -> None:
    global _current
    _lazy_init()
    index = device if isinstance(device, int) else getattr(device, "index", 0) or 0
    if not 0 <= index < device_count():
        raise RuntimeError("CUDA error: invalid device ordinal")
    _current = index


def current_device() -> int:
    return _current


def synchronize(device=None) -> None:
    """Wait for what was queued on the GPUs: the collectives (torch.distributed) and the time they take."""
    _lazy_init()
    from torch import distributed
    distributed.synchronize()
