"""8x RTX PRO 6000 Blackwell (sm_120, 96 GB each) on PCIe, no NVLink: the CT200 box."""

from deployment import site_data as _site_data

# What preflight expects of the hardware (operations.gpu checks the host's facts against it).
expected_gpus = dict(
    # nvidia-smi --query-gpu=name; all PCIe Blackwell PRO 6000 variants share sm_120 and 96 GB.
    name_patterns=[r"^NVIDIA RTX PRO 6000 Blackwell (Server|Workstation|Max-Q Workstation) Edition$"],
    count=8,  # Kimi K2.6 needs all 8 cards; 4 run out of memory
    min_memory_mib=97000,  # 97887 MiB reported per card
    compute_capability="12.0",
    interconnect="pcie",  # only PIX/PXB/NODE/SYS between cards
    driver_min="580",  # SGLang 0.5.23 wheels are CUDA 13 builds: driver branch 580+
    open_kernel_module=True,  # Blackwell PRO cards only work with the open modules
    fabric_manager=False,  # no NVSwitch: fabric manager fails on such boxes (gpu-operator#610)
    # GPU smoke test: NCCL all-reduce bus bandwidth floor (GB/s, at 512 MiB). 8 PCIe Gen5 cards read
    # ~28 (8x RTX 5090, NVIDIA/nccl#1639); a link trained down or a path through a starved CPU falls
    # far below. A hanging P2P all-reduce (nccl#1999) fails on the smoke test's timeout instead.
    allreduce_floor_gbps=5,
    # PCIe peer-to-peer is decided per host by the GPU smoke test: P2P first; a hang, an error or a bus
    # bandwidth below this floor turns it off for that host. The path through host memory read 27.2 GB/s
    # at 512 MiB on a real pair (tests/fixtures/nvidia-smi/h200-x2-smoke/p2p-disabled.txt): P2P slower
    # than ~30 gains nothing over it, and ACS or the IOMMU routing P2P through the CPU reads like that
    # (NCCL's troubleshooting guide: "a significant performance reduction or even a hang").
    p2p_floor_gbps=30,
)

# How each profile is served here (deployment/server/layout.py): the tensor-parallel size of one SGLang
# server, and by default as many such servers (replicas, each a unit on GPUs of its own, all behind the
# gateway) as the 8 cards hold. Optional per profile: replicas=N, gpus=[...] (the cards they take, tp_size
# at a time), context_length=N (--context-length: the longest request, where the KV cache holds less than
# the model's own context). A profile not named here is one server over all 8 cards.
# The KV plans below are preflight's (deployment/server/capacity.py, SGLang 0.5.23's sizing), for 97,887 MiB
# cards, a 6 GB Kimi drafter and a 3.5 GB Qwen drafter of five Qwen3-4B-shaped layers; a deploy reads the
# hub's real sizes and configs. Each layout holds at least one full context of what it serves, the
# min_kv_tokens default.
layouts = dict(
    # Kimi K2.6's ~595 GB of weights: 74 GB a card at TP 8 of 86 GB usable (0.90 of 96 GB); at TP 4,
    # 149 GB a card does not fit. One server over all eight cards. Its KV cache with the drafter holds
    # about 205,000 tokens (70,272 bytes a token of MLA), less than the model's 262,144-token context, and
    # SGLang would refuse a longer request anyway (max_req_input_len): the context is 192K, which it holds
    # once, 25 requests of 8,192 tokens. An fp8 KV cache would double the pool, but whether FlashInfer's MLA
    # kernels serve it on sm_120 is unmeasured.
    kimi_k26_dflash=dict(tp_size=8, context_length=196608),
    # Qwen3.6-27B's ~54 GB fits one card with ~30 GB left for the KV cache. A TP 8 server pays a PCIe
    # all-reduce on every token (through the CPU where the host's smoke test turns peer-to-peer off);
    # eight TP 1 replicas pay none. The CT200 measurements that started this project: DDTree (budget
    # 15) 6.5x autoregressive decoding on one GPU, its lead narrowing at higher concurrency under PCIe
    # all-reduce. A TP 1 replica's KV cache holds about 233,000 tokens, less than the model's 262,144-token
    # context: the context is 160K, which it holds once, and SGLang runs 5 requests at once, bound by its
    # recurrent state's slots (3 a request with no_buffer, and an intermediate state per draft token for
    # each running request); TP 2 would hold about 814,000 and run 19 a replica. Per-request speed is what
    # TP 1 was measured for; the host's throughput at high concurrency may favour TP 2 (tune.py measures
    # both on the host).
    qwen36_ddtree=dict(tp_size=1, context_length=163840),
    # The same model without a drafter's weights and KV: a TP 1 replica holds about 322,000 tokens with MTP,
    # 318,000 autoregressive, one full context each, 14 and 23 requests at once (the state slots bind).
    qwen36_mtp=dict(tp_size=1),
    qwen36_ar=dict(tp_size=1),
)

sglang_tuning = dict(
    # sm_120: trtllm_mla fails at runtime (sglang#24633) and FA3/FA4 need sm_90/sm_100 instructions,
    # so flashinfer for target and drafter (community Kimi recipe: 73-90 tok/s). Keyed by the
    # profile's attention kind: (target backend, draft backend).
    attention_backends=dict(mla=("flashinfer", "flashinfer"), mha=("flashinfer", "flashinfer")),
    mem_fraction_static=0.90,  # leave room for the drafter and CUDA graphs on 96 GB cards
    extra_args=[
        "--chunked-prefill-size", "8192",  # community recipe for Kimi on PRO 6000
        # CUDA graphs for every batch the scheduler runs: speculation defaults max running requests
        # to 48 (0.5.23 srt/arg_groups/speculative_hook.py, _handle_dflash); the community recipe's
        # 16 left batches 17-48 without graphs. 0.5.23 splits --cuda-graph-max-bs into decode/prefill.
        "--cuda-graph-max-bs-decode", "48",
    ],
    # NCCL_P2P_DISABLE is not set for the whole class: P2P all-reduce hangs reported on this card
    # (NVIDIA/nccl#1999; local-inference-lab/rtx6kpro#15 with NCCL 2.30.4) come from the host, usually
    # PCIe ACS or the IOMMU (an NCCL maintainer in NVIDIA/nccl#631; nccl#2079 was fixed by turning ACS
    # off), and disabling P2P only costs speed. The GPU smoke test measures each host and turns P2P off
    # (NCCL_P2P_DISABLE=1 in the unit's environment) only where it hangs, fails or is slow
    # (expected_gpus p2p_floor_gbps above). NCCL_PROTO is left to NCCL: listing LL128 forces it on PCIe
    # paths, where NCCL's environment documentation warns it can corrupt data (notes sglang.md section 8).
    env=dict(),
)

# The settings tune.py measured best for each profile here (SPECFLEET_SITE/tuned/rtx_pro_6000_pcie/PROFILE.json),
# applied by the deploy over this file's and the profile's where measured with the build it deploys.
tuned = _site_data.tuned(__file__)

# SPECFLEET_SITE/group_data/rtx_pro_6000_pcie.py (your site directory, outside this checkout) overrides these values
# (deployment/site_data.py).
globals().update(_site_data.overrides(__file__, globals()))
