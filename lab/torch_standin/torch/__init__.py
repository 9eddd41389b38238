# LAB STAND-IN, NOT PyTorch: lab hosts have no GPU. Shipped in the lab's SGLang stand-in wheel, so the
# SGLang venv of a lab host imports it where a real host's imports torch.
"""The part of PyTorch the GPU smoke test uses (operations/gpu/host_scripts/gpu_smoke.py), answering
from the host's GPU profile as the real torch + NCCL would on those GPUs.

Tensors hold no data beyond what the smoke test reads back: a buffer filled with one value stays
that value (an all-reduce of N such buffers is their sum, exact), small tensors built from lists
keep their elements. Collectives (torch.distributed, backend "nccl") run between the processes that
call init_process_group, over TCP on its init_method's port, and take the time the profile's bus
bandwidth gives their size (torch/_gpus.py: which transport NCCL takes, and a P2P path that hangs).
"""

import builtins as _builtins

__version__ = "2.11.0+lab"  # the release a real 2x H200 smoke test ran (2.11.0+cu130), marked as the lab's


class dtype:
    def __init__(self, name: str, itemsize: int):
        self.name, self.itemsize = name, itemsize

    def __repr__(self):
        return f"torch.{self.name}"


float32 = float = dtype("float32", 4)
float64 = double = dtype("float64", 8)
int64 = long = dtype("int64", 8)
bool = dtype("bool", 1)  # noqa: A001 (torch.bool, as the real module names it)


class device:
    def __init__(self, type: str, index: int | None = None):
        if ":" in type:
            type, index = type.split(":", 1)[0], int(type.split(":", 1)[1])
        self.type, self.index = type, index

    def __repr__(self):
        return f"device(type={self.type!r}" + (f", index={self.index})" if self.index is not None else ")")


def _cuda_used(where) -> None:
    if where is not None and str(getattr(where, "type", where)).startswith("cuda"):
        from torch import cuda
        cuda._lazy_init()


class Tensor:
    """A tensor of `numel` elements: all one value (`fill`) or the listed `values`."""

    def __init__(self, numel: int, dtype_: dtype, fill=0, values: list | None = None, device_=None):
        self.numel_, self.dtype, self.fill, self.values, self.device = numel, dtype_, fill, values, device_
        self.pending = None  # the collective whose result this tensor awaits (torch.distributed)

    def _settled(self):
        if self.pending is not None:
            distributed._result_into(self)
        return self

    def numel(self) -> int:
        return self.numel_

    def element_size(self) -> int:
        return self.dtype.itemsize

    def nbytes_(self) -> int:
        return self.numel_ * self.dtype.itemsize

    nbytes = property(nbytes_)

    def fill_(self, value):
        self._settled()  # in stream order: after what was queued on it
        self.fill, self.values = value, None
        return self

    def _elements(self) -> list:
        self._settled()
        return list(self.values) if self.values is not None else [self.fill]

    def __eq__(self, other):
        self._settled()
        if isinstance(other, Tensor):
            other = other._elements()[0] if other.numel_ == 1 else other.fill
        if self.values is not None:
            return Tensor(self.numel_, bool, values=[value == other for value in self.values], device_=self.device)
        return Tensor(self.numel_, bool, fill=self.fill == other, device_=self.device)

    __hash__ = None

    def item(self):
        if self.numel_ != 1:
            raise RuntimeError(f"a Tensor with {self.numel_} elements cannot be converted to Scalar")
        value = self._elements()[0]
        return _builtins.bool(value) if self.dtype is bool else value

    def tolist(self):
        self._settled()
        return self._elements() if self.values is not None else [self.fill] * self.numel_

    def __repr__(self):
        return f"tensor({self.tolist() if self.numel_ <= 8 else '...'}, dtype={self.dtype!r})"


def empty(*size, dtype=float32, device=None, **_):
    _cuda_used(device)
    numel = 1
    for dimension in (size[0] if len(size) == 1 and isinstance(size[0], (tuple, list)) else size):
        numel *= int(dimension)
    return Tensor(numel, dtype, device_=device)


def zeros(*size, dtype=float32, device=None, **_):
    return empty(*size, dtype=dtype, device=device).fill_(0)


def tensor(data, dtype=None, device=None, **_):
    _cuda_used(device)
    values = list(data) if isinstance(data, (list, tuple)) else [data]
    kind = dtype or (float32 if any(isinstance(v, _builtins.float) for v in values) else int64)
    return Tensor(len(values), kind, values=values, device_=device)


def all(input):  # noqa: A001 (torch.all)
    return Tensor(1, bool, values=[_builtins.all(input._elements())], device_=input.device)


from torch import cuda, distributed  # noqa: E402  (they use the names above)
