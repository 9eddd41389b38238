# LAB STAND-IN, NOT PyTorch's torch.cuda.nccl (see torch/__init__.py).


def version() -> tuple[int, int, int]:
    """The NCCL a real 2x H200 smoke test ran with (2.28.9, from the nvidia-nccl-cu13 wheel)."""
    return (2, 28, 9)
