"""8x B200 HGX (sm_100, 180 GB each), NV18 NVLink between every pair through NVSwitch."""

from deployment import site_data as _site_data

expected_gpus = dict(
    name_patterns=[r"^NVIDIA B200$"],
    count=8,
    min_memory_mib=180000,  # 183359 MiB reported per card
    compute_capability="10.0",
    interconnect="nvlink",  # every GPU pair must read NV#; one PCIe-only GPU is a degraded board
    driver_min="580",  # SGLang 0.5.23 wheels are CUDA 13 builds
    open_kernel_module=True,  # Blackwell data-center parts require the open modules
    fabric_manager=True,  # NVSwitch: without fabric manager CUDA fails with error 802
    # GPU smoke test: NCCL all-reduce bus bandwidth (GB/s, at 512 MiB) that proves NVLink. Above any
    # PCIe path (a real 2x H200 pair read 27.2 with NCCL_P2P_DISABLE=1; PCIe Gen5 x16 carries ~64 each
    # way), well below NVLink (the same pair read 313 over NV18): tests/fixtures/nvidia-smi/h200-x2-smoke.
    allreduce_floor_gbps=150,
    p2p_floor_gbps=None,  # NVLink is the P2P path: never turned off (the host-memory path fails the floor above)
)

# How each profile is served here (deployment/server/layout.py; group_data/rtx_pro_6000_pcie.py explains
# the keys). A profile not named here is one server over all 8 GPUs.
layouts = dict(
    # Kimi K2.6's ~595 GB: 74 GB a GPU at TP 8 of 162 GB usable (0.90 of 180 GB); TP 4 would hold the
    # weights (149 GB a GPU) with ~13 GB left for the KV cache. One server over all eight GPUs: its KV plan
    # (deployment/server/capacity.py, 183,359 MiB cards) holds about 1.31 million tokens, five full contexts.
    kimi_k26_dflash=dict(tp_size=8),
    # Qwen3.6-27B's ~54 GB fits one GPU with over 100 GB left for the KV cache. NVLink makes TP's
    # all-reduce cheap, but nothing is gained by splitting a model that fits: SGLang's guide to data
    # parallelism (https://docs.sglang.io/advanced_features/dp_dpa_smg_guide.html) puts a full copy on
    # each GPU set behind the gateway, throughput "multiplied nearly linearly". No NVLink measurement of
    # this model in this project says otherwise; tp_size=2 trades throughput for per-request latency.
    # KV plan of a TP 1 replica: about 727,000 tokens, 18 requests running at once (its recurrent state's
    # slots bind first).
    qwen36_ddtree=dict(tp_size=1),
    qwen36_mtp=dict(tp_size=1),  # the same model drafting with its own layer: about 968,000 tokens a replica
    qwen36_ar=dict(tp_size=1),  # and without speculation: about 963,000
)

sglang_tuning = dict(
    # sm_100: the z-lab Kimi DFlash recipe (trtllm_mla target, fa4 drafter); SGLang picks
    # trtllm_mla for Kimi itself, written out to pin it. MHA/hybrid models: flashinfer, not
    # trtllm_mha, which forces the page size to 16-128 (0.5.23 srt/arg_groups/overrides.py,
    # _mla_backend_page_constraints); the DDTree profile names its own backend (triton).
    attention_backends=dict(mla=("trtllm_mla", "fa4"), mha=("flashinfer", "fa4")),
    mem_fraction_static=0.90,
    extra_args=[],
    env=dict(),  # NVLink + NVSwitch: NCCL's defaults are right
)

# The settings tune.py measured best for each profile here (SPECFLEET_SITE/tuned/b200_nvlink/PROFILE.json),
# applied by the deploy over this file's and the profile's where measured with the build it deploys.
tuned = _site_data.tuned(__file__)

# SPECFLEET_SITE/group_data/b200_nvlink.py (your site directory, outside this checkout) overrides these values
# (deployment/site_data.py).
globals().update(_site_data.overrides(__file__, globals()))
