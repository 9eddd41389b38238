"""8x H100 SXM5 80GB HGX (sm_90, 80 GB each), NV18 NVLink between every pair through NVSwitch."""

from deployment import site_data as _site_data

expected_gpus = dict(
    # `nvidia-smi --query-gpu=name` of an HGX H100 SXM5 80GB card (notes sglang.md section 11, a real H100 host;
    # all eight cards of a published 8x H100 SXM HGX's nvidia-smi, NVIDIA/nccl#1264, print it with 81559MiB and
    # 700 W; the H100 PCIe and NVL cards print other names and have no NVSwitch).
    name_patterns=[r"^NVIDIA H100 80GB HBM3$"],
    count=8,
    min_memory_mib=81000,  # 81559 MiB reported per card (notes sglang.md section 11, a real H100 80GB HBM3)
    compute_capability="9.0",
    # Every GPU pair reads NV18 through the NVSwitches (tests/fixtures/nvidia-smi/h100-8x-nvlink-topo-rows-only,
    # a published 8x H100 topo -m); one PCIe-only GPU is a degraded board.
    interconnect="nvlink",
    driver_min="580",  # SGLang 0.5.23 wheels are CUDA 13 builds: driver branch 580+
    # Hopper runs with either kernel module (NVIDIA's open-gpu-kernel-modules supports Turing and later; only
    # Grace Hopper and Blackwell require the open one), so preflight refuses no proprietary 580 driver here;
    # `install_driver` installs the open one, as on every class.
    open_kernel_module=False,
    # NVSwitch: without fabric manager CUDA fails with error 802. No nvlsm: the NVLink Subnet Manager is for
    # NVLink5 (Blackwell, compute capability 10.x), which operations/gpu/nvidia.py fabric_manager installs it for.
    fabric_manager=True,
    # GPU smoke test: NCCL all-reduce bus bandwidth (GB/s, at 512 MiB) that proves NVLink, as b200_nvlink.py:
    # a real 2x H200 pair (NVLink4, this board's generation) read 313 over NV18 and 27.2 with NCCL_P2P_DISABLE=1
    # (tests/fixtures/nvidia-smi/h200-x2-smoke).
    allreduce_floor_gbps=150,
    p2p_floor_gbps=None,  # NVLink is the P2P path: never turned off
)

# How each profile is served here (deployment/server/layout.py; group_data/rtx_pro_6000_pcie.py explains
# the keys). A profile not named here is one server over all 8 GPUs. The KV plans below are preflight's
# (deployment/server/capacity.py) for 81,559 MiB cards.
# Kimi K2.6 (kimi_k26_dflash, kimi_k26_ddtree) does not fit one host, so it has no layout: its ~595 GB of
# weights are 74.4 GB a GPU at TP 8, which 80 GB cards hold (69.6 GiB usable at 0.90 of what a TP-8 rank finds
# free before its load) with nothing left for the KV cache: SGLang stops after the load ("Loaded weights leave no GPU
# memory for the KV cache"), and preflight refuses it in one line ("its KV cache holds 0 tokens ..., fewer than
# one full context"). SGLang's Kimi K2.6 cookbook asks for 140 GB a GPU at TP 8 (notes sglang.md section 3). Two
# such hosts serve it as one TP 16 server (a node group, group_data/all.py node_groups): about 509,000 tokens.
layouts = dict(
    # Qwen3.6-27B's ~54 GB fits one GPU, but a TP 1 replica's KV cache holds about 112,000 tokens, less than
    # the model's 262,144-token context, and 2 requests of 8,192 tokens; TP 2 holds about 577,000 and 14 a
    # replica, four replicas a host.
    qwen36_ddtree=dict(tp_size=2),
    # Without a drafter a TP 1 replica holds about 198,000 tokens (MTP), still short of one context; TP 2
    # about 808,000 with MTP, 801,000 autoregressive.
    qwen36_mtp=dict(tp_size=2),
    qwen36_ar=dict(tp_size=2),
)

sglang_tuning = dict(
    # sm_90: FA3 is SGLang 0.5.23's own choice on Hopper for MLA (Kimi) and for MHA with one-token drafts, as
    # DFlash drafts (srt/arg_groups/model_override_base.py get_default_attn_backend; flashinfer regressed on
    # Hopper, sgl-project/sglang#17411), and DFlash's draft backend follows the target's
    # (speculative_hook.py _resolve_dflash_draft_attention_backend). trtllm_mla is Blackwell-only (the real
    # resolution refuses it on Hopper: tests/unit/test_sglang_resolution.py); the DDTree tree profile names
    # its own backend (triton).
    attention_backends=dict(mla=("fa3", "fa3"), mha=("fa3", "fa3")),
    mem_fraction_static=0.90,
    extra_args=[],
    # NVLink + NVSwitch: NCCL's defaults are right (NVLink SHARP where the fabric offers it: NCCL_NVLS_ENABLE's
    # default).
    env=dict(),
)

# The settings tune.py measured best for each profile here (SPECFLEET_SITE/tuned/h100_sxm/PROFILE.json),
# applied by the deploy over this file's and the profile's where measured with the build it deploys.
tuned = _site_data.tuned(__file__)

# SPECFLEET_SITE/group_data/h100_sxm.py (your site directory, outside this checkout) overrides these values
# (deployment/site_data.py).
globals().update(_site_data.overrides(__file__, globals()))
