"""8x H200 SXM 141GB HGX (sm_90, 141 GB each), NV18 NVLink between every pair through NVSwitch."""

from deployment import site_data as _site_data

expected_gpus = dict(
    # `nvidia-smi --query-gpu=name` of an HGX H200 card (tests/fixtures/nvidia-smi/h200-x2: two GPUs of a real
    # board, 700 W cap, fabric registration Completed; the PCIe H200 NVL prints "NVIDIA H200 NVL").
    name_patterns=[r"^NVIDIA H200$"],
    count=8,
    min_memory_mib=143000,  # 143771 MiB reported per card (tests/fixtures/nvidia-smi/h200-x2, h200-x1)
    compute_capability="9.0",
    # Every GPU pair reads NV18 through the NVSwitches (the real pair of tests/fixtures/nvidia-smi/h200-x2, and
    # the H100 board of this generation: h100-8x-nvlink-topo-rows-only); one PCIe-only GPU is a degraded board.
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
    # two GPUs of a real H200 board read 313 over NV18 and 27.2 with NCCL_P2P_DISABLE=1
    # (tests/fixtures/nvidia-smi/h200-x2-smoke).
    allreduce_floor_gbps=150,
    p2p_floor_gbps=None,  # NVLink is the P2P path: never turned off
)

# How each profile is served here (deployment/server/layout.py; group_data/rtx_pro_6000_pcie.py explains
# the keys). A profile not named here is one server over all 8 GPUs. The KV plans below are preflight's
# (deployment/server/capacity.py) for 143,771 MiB cards.
layouts = dict(
    # Kimi K2.6's ~595 GB: 74.4 GB a GPU at TP 8 of 126 GiB usable (0.90), SGLang's cookbook's H200 setup
    # (notes sglang.md section 3); TP 4 (149 GB a GPU) does not fit. One server over all eight GPUs: about
    # 798,000 tokens with the 6 GB drafter, three full contexts; it runs 48 requests at once (DFlash's default).
    kimi_k26_dflash=dict(tp_size=8),
    # Qwen3.6-27B's ~54 GB fits one GPU, as on B200: one replica a GPU behind the gateway (b200_nvlink.py
    # says why). A TP 1 replica holds about 472,000 tokens, 11 requests of 8,192 tokens.
    qwen36_ddtree=dict(tp_size=1),
    qwen36_mtp=dict(tp_size=1),  # with its own MTP layer, no drafter: about 665,000 tokens a replica
    qwen36_ar=dict(tp_size=1),  # and without speculation: the same
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

# The settings tune.py measured best for each profile here (SPECFLEET_SITE/tuned/h200_sxm/PROFILE.json),
# applied by the deploy over this file's and the profile's where measured with the build it deploys.
tuned = _site_data.tuned(__file__)

# SPECFLEET_SITE/group_data/h200_sxm.py (your site directory, outside this checkout) overrides these values
# (deployment/site_data.py).
globals().update(_site_data.overrides(__file__, globals()))
