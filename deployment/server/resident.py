"""What each GPU of an SGLang engine holds before it sizes its KV pool, and what CUDA never shows of a card: the
one place these figures live (the planner, deployment/server/capacity.py, and the host's engine check ask it).

>>> resident_before_load(4) // MIB
551
"""

MIB = 1 << 20

# What a GPU holds outside the KV pool's reach, per GPU. Measured on a real
# H100 80GB HBM3 and a real H200 (driver 580.159.04, torch 2.11.0+cu130, NCCL 2.28.9, one GPU each, 2026-12-07):
# - CUDA's total (torch.cuda.mem_get_info, what SGLang reads) is below nvidia-smi's memory.total (what the host's
#   facts give as card_bytes) by 480 MiB on the H100 (81,079 of 81,559) and 615 MiB on the H200 (143,156 of
#   143,771); other cards' on the line through the two (not measured: an extrapolation);
CUDA_UNSEEN_MEASURED = ((81_559, 480), (143_771, 615))  # (nvidia-smi's MiB, MiB CUDA does not show)
# - a process's CUDA context: 527 MiB on both, resident when SGLang reads its free memory before the load.
CUDA_CONTEXT_BYTES = 527 * MIB
# - one cuBLAS matmul left 68 MiB of workspace and a one-rank NCCL communicator with one all-reduce 654 MiB more
#   outside torch's allocator (1,249 MiB with the context on the H100, 1,243 on the H200). Neither is counted: both
#   arrive after the pool is sized, out of the (1 - mem_fraction_static) slack. SGLang's first matmul and first
#   collective on the GPU come in its warm-up and CUDA-graph capture, and NCCL connects peers (its buffers:
#   NCCL_BUFFSIZE's 4 MiB and the LL/LL128 buffers per connection and channel) at a communicator's first
#   collective (NCCL_RUNTIME_CONNECT, 1 by default since NCCL 2.22; TensorRT-LLM turns it off "for accurate KV
#   cache size estimation"). A public TP-4 startup log (tests/fixtures/startup_logs/qwq-32b-l4-tp4.json) found
#   0.86 GiB resident before the load, what the CUDA context and the unseen memory alone make.
# - the parallel groups at TP 8 and above: a public SGLang 0.5.18 log of 8x H100 80GB HBM3 on NVSwitch
#   (tests/fixtures/startup_logs/deepseek-r1-0528-cpu-experts-h100-tp8.json) prints "Init torch distributed ends.
#   ... mem usage=1.29 GB" (GiB, as SGLang prints them), where the TP-4 log above printed 0.13 GB, and a Grok-2 log
#   on 8x H100 1.25 GB: NCCL's communicators and, on NVSwitch, their NVLS buffers, with the custom all-reduce in
#   them. With the context that is 1.80 GiB resident, of the 1.85 the TP-8 log's card did not show free before its
#   load. Counted at TP 8 on every class: not measured over PCIe at TP 8 (the RTX PRO 6000 class), where it errs
#   towards fewer tokens, the side a floor may err on; nor at TP 2-6 on NVLink, where the custom all-reduce alone
#   is counted.
PARALLEL_GROUPS_TP8_BYTES = round(1.29 * (1 << 30))
# From source: SGLang's custom all-reduce (2, 4, 6 or 8 ranks) allocates its meta block and buffer of
# _MAX_CAR_SIZE 8 MiB each and 8 MiB of rank data when its group is built, before the load (0.5.23
# srt/distributed/device_communicators/custom_all_reduce.py, CustomAllreduce.__init__; it turns itself off on
# more than two PCIe-only GPUs, where counting it errs towards fewer tokens).
CUSTOM_ALL_REDUCE_BYTES = 3 * 8 * MIB
CUSTOM_ALL_REDUCE_RANKS = (2, 4, 6, 8)  # CustomAllreduce._SUPPORTED_WORLD_SIZES


def cuda_unseen_bytes(card_bytes: int) -> int:
    """What CUDA does not show of a card of nvidia-smi's `card_bytes` (CUDA_UNSEEN_MEASURED's line)."""
    (mib_a, unseen_a), (mib_b, unseen_b) = CUDA_UNSEEN_MEASURED
    unseen_mib = unseen_a + (card_bytes / MIB - mib_a) * (unseen_b - unseen_a) / (mib_b - mib_a)
    return max(int(unseen_mib * MIB), 0)


def resident_before_load(tp_size: int) -> int:
    """What each GPU of a TP-`tp_size` engine holds when SGLang reads its free memory before the weights load
    (distributed/bootstrap.py measure_pre_model_load_memory: after the CUDA context and the parallel groups)."""
    if tp_size >= 8:
        return CUDA_CONTEXT_BYTES + PARALLEL_GROUPS_TP8_BYTES
    return CUDA_CONTEXT_BYTES + (CUSTOM_ALL_REDUCE_BYTES if tp_size in CUSTOM_ALL_REDUCE_RANKS else 0)
