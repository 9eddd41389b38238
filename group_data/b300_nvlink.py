"""8x B300 HGX (sm_103, 268 GB each), NV18 NVLink between every pair through NVSwitch."""

from deployment import site_data as _site_data

expected_gpus = dict(
    name_patterns=[r"^NVIDIA B300 SXM6 AC$"],
    count=8,
    min_memory_mib=270000,  # 275040 MiB reported per card
    compute_capability="10.3",
    interconnect="nvlink",
    driver_min="580",
    open_kernel_module=True,
    fabric_manager=True,
    allreduce_floor_gbps=150,  # NVLink territory, as b200_nvlink.py explains
    p2p_floor_gbps=None,  # NVLink is the P2P path, as b200_nvlink.py explains
)

# As b200_nvlink.py: one Kimi K2.6 server over all eight GPUs (at TP 4 two would fit the weights, 149 GB
# of 247 GB usable a GPU, but no measurement here says they serve better); Qwen3.6-27B one replica a GPU.
# KV plans (deployment/server/capacity.py, 275,040 MiB cards): Kimi K2.6 about 2.50 million tokens; a
# Qwen3.6-27B replica about 1.25 million, 32 requests running at once.
layouts = dict(
    kimi_k26_dflash=dict(tp_size=8),
    qwen36_ddtree=dict(tp_size=1),
    qwen36_mtp=dict(tp_size=1),  # Qwen3.6-27B with its own MTP layer: about 1.94 million tokens a replica
    qwen36_ar=dict(tp_size=1),  # and without speculation: about 1.66 million
)

sglang_tuning = dict(
    # SM10x family: the same backends as B200 (flashinfer for MHA).
    attention_backends=dict(mla=("trtllm_mla", "fa4"), mha=("flashinfer", "fa4")),
    mem_fraction_static=0.90,
    extra_args=[],
    env=dict(),
)

# The settings tune.py measured best for each profile here (SPECFLEET_SITE/tuned/b300_nvlink/PROFILE.json),
# applied by the deploy over this file's and the profile's where measured with the build it deploys.
tuned = _site_data.tuned(__file__)

# SPECFLEET_SITE/group_data/b300_nvlink.py (your site directory, outside this checkout) overrides these values
# (deployment/site_data.py).
globals().update(_site_data.overrides(__file__, globals()))
