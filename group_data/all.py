"""What is deployed, on every host. Per-class tuning lives in group_data/<class>.py.

Pick another ready-made profile in your site directory (SPECFLEET_SITE/group_data/all.py, or a class's file):
    profile = "qwen36_ddtree"
A deploy refuses it from --data, which would last one run: every later command reads the group data.
"""

from deployment import network as _network, site_data as _site_data

# The deployment profile (a key of `profiles` below), served as the host's class lays it out
# (group_data/<class>.py `layouts`: TP size, replicas, GPUs).
profile = "kimi_k26_dflash"

# Several models on one host: a list of deployments, each a profile on GPUs of its own, e.g. in a
# host's inventory data
#     deployments=[dict(profile="kimi_k26_dflash", gpus=[0, 1, 2, 3], tp_size=4),
#                  dict(profile="qwen36_ddtree", gpus=[4, 5, 6, 7])]
# Optional per entry: name (default: the profile's; units, ports and virtualenvs are told apart by
# it), port (its replica on its lowest GPU; default `port` + that GPU's index), tp_size, replicas and
# context_length (default: the class's layout of the profile). None: `profile` on all of the host's GPUs.
deployments = None

# Each profile names the target model, its drafter, the speculative algorithm and
# the SGLang build that serves it. Revisions and git refs that move (a branch, a pull
# request's ref) are deployed at the commit `python pin.py INVENTORY` resolved them to
# (`pins` below, in your site directory); preflight refuses one without a pin, naming
# the commit it points at now; allow_branch_revisions=true deploys it anyway with a warning.
profiles = {
    # Kimi K2.6 (1T MoE, MLA, ~595 GB) with z-lab's gated DFlash drafter.
    "kimi_k26_dflash": dict(
        target=dict(repo="moonshotai/Kimi-K2.6", revision="main"),
        drafter=dict(repo="z-lab/Kimi-K2.6-DFlash", revision="main"),
        attention="mla",  # picks the class's MLA backends
        speculative=dict(
            algorithm="DFLASH",
            num_draft_tokens=8,  # the DFlash block size of the Kimi drafter (model card)
            draft_window_size=4096,  # draft KV sliding window (model card)
        ),
        served_model_name="kimi-k2.6",
        server_args=[
            "--trust-remote-code",  # KimiK25ForConditionalGeneration ships its own code
            "--reasoning-parser", "kimi_k2",
            "--tool-call-parser", "kimi_k2",
        ],
        # DFlash builds the drafter with the target's context length; SGLang refuses one above the
        # drafter's max_position_embeddings unless this is set (0.5.23 srt/configs/model_config.py,
        # srt/speculative/draft_worker_common.py; z-lab's README exports it before every command).
        env=dict(SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN="1"),
        sglang=dict(requirement="sglang==0.5.23", version="0.5.23"),
    ),
    # Qwen3.6-27B (hybrid attention) with DFlash drafts, DDTree in spine mode: budget 15 with the
    # 16-token drafter verifies one chain, as DFLASH does (PR #29907 speculative/ddtree_worker.py: a
    # budget <= draft tokens - 1 builds no tree), on the class's own MHA backend. Budget 15 was the
    # seed's best on this model: larger budgets (a tree) lost to Mamba state leakage on its hybrid layers.
    "qwen36_ddtree": dict(
        target=dict(repo="Qwen/Qwen3.6-27B", revision="main"),
        drafter=dict(repo="z-lab/Qwen3.6-27B-DFlash", revision="main"),
        attention="mha",
        speculative=dict(
            algorithm="DDTREE",
            num_draft_tokens=16,  # the drafter's block size
            ddtree_budget=15,  # spine mode: draft tokens - 1
        ),
        served_model_name="qwen3.6-27b",
        server_args=[
            "--trust-remote-code",
            "--page-size", "1",  # DDTree (PR #29907) requires page_size == 1
            "--disable-overlap-schedule",  # and runs without the overlap scheduler
            # Hybrid model + speculation + radix cache, without the overlap schedule: no_buffer, the engine's
            # own verdict. The lazy extra buffer asserts at pool sizing, after the weights load, without the
            # overlap schedule (0.5.23 mem_cache/kv_cache_configurator.py _calculate_mamba_ratio: "Lazy extra
            # buffer requires overlap schedule"); the non-lazy extra buffer rejects or corrupts drafts under KV
            # pressure (sgl-project/sglang#36537, open) and takes 4 state slots a request; no_buffer takes 3, so
            # more requests run at once, and is what `auto` resolves to here (arg_groups/overrides.py: no
            # overlap, pages of 1). What it gives up: the radix cache keeps a request's state only where it
            # ends (no_buffer donates its live state: managers/scheduler_components/batch_result_processor.py),
            # not at the extra buffer's tracked checkpoints, so fewer prefix hits on the hybrid layers.
            "--mamba-radix-cache-strategy", "no_buffer",
        ],
        env=dict(SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN="1"),  # z-lab's Qwen3.6 recipe
        # DDTree is in no SGLang release up to 0.5.23: it lives in open pull request 29907, whose
        # ref `python pin.py` resolves to a commit (git ls-remote) like the revisions above.
        sglang=dict(
            requirement="sglang @ git+https://github.com/sgl-project/sglang@refs/pull/29907/head#subdirectory=python",
            version="0.5.23",
        ),
    ),
    # Qwen3.6-27B drafting with its own multi-token-prediction layer (MTP: SGLang's EAGLE path, no drafter repo,
    # nothing gated, nothing more to download): the model card's SGLang command, 3 steps of top-1 drafts,
    # 4 tokens verified a step (Qwen/Qwen3.6-27B README, "Multi-Token Prediction (MTP)").
    "qwen36_mtp": dict(
        target=dict(repo="Qwen/Qwen3.6-27B", revision="main"),
        attention="mha",
        speculative=dict(algorithm="MTP", num_draft_tokens=4, num_steps=3, eagle_topk=1),
        served_model_name="qwen3.6-27b",
        server_args=[
            "--trust-remote-code",
            # Hybrid model + speculation + radix cache with the overlap schedule (on by default): the lazy extra
            # buffer. `auto` would take the extra buffer, which rejects or corrupts drafts under KV pressure
            # (sgl-project/sglang#36537, open; the lazy one is the fix it points to) and takes 5 state slots a
            # request with the overlap schedule, the lazy one 4 (0.5.23 mem_cache/kv_cache_configurator.py
            # _calculate_mamba_ratio).
            "--mamba-radix-cache-strategy", "extra_buffer_lazy",
        ],
        sglang=dict(requirement="sglang==0.5.23", version="0.5.23"),
    ),
    # Qwen3.6-27B served autoregressively: no speculation, no drafter, what every speculative profile of the
    # model is measured against.
    "qwen36_ar": dict(
        target=dict(repo="Qwen/Qwen3.6-27B", revision="main"),
        attention="mha",
        served_model_name="qwen3.6-27b",
        server_args=["--trust-remote-code"],
        sglang=dict(requirement="sglang==0.5.23", version="0.5.23"),
    ),
    # Kimi K2.6 with its DFlash drafter, DDTree verifying a real tree: budget 16 > the 8-token
    # drafter's 7, so each step verifies 17 nodes. Kimi's attention is MLA over every layer, where
    # a tree's verify is exact (no recurrent state to leak between branches). The tree verify is
    # triton-only (PR #29907 since 93e9850e4) on every class; the PR's worker takes Kimi's
    # vocab-parallel lm_head (KimiK25ForConditionalGeneration.lm_head) as DFLASH does. 16 is the
    # smallest budget the DDTree paper's reference runs (liranringel/ddtree benchmark.py); no
    # measurement here says which serves Kimi best.
    "kimi_k26_ddtree": dict(
        target=dict(repo="moonshotai/Kimi-K2.6", revision="main"),
        drafter=dict(repo="z-lab/Kimi-K2.6-DFlash", revision="main"),
        attention="mla",
        attention_backend="triton",
        speculative=dict(
            algorithm="DDTREE",
            num_draft_tokens=8,  # the DFlash block size of the Kimi drafter (model card)
            draft_window_size=4096,  # draft KV sliding window (model card)
            ddtree_budget=16,
        ),
        served_model_name="kimi-k2.6",
        server_args=[
            "--trust-remote-code",
            "--reasoning-parser", "kimi_k2",
            "--tool-call-parser", "kimi_k2",
            "--page-size", "1",  # DDTree (PR #29907) requires page_size == 1
            "--disable-overlap-schedule",  # and runs without the overlap scheduler
        ],
        env=dict(SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN="1"),  # as kimi_k26_dflash
        sglang=dict(
            requirement="sglang @ git+https://github.com/sgl-project/sglang@refs/pull/29907/head#subdirectory=python",
            version="0.5.23",
        ),
    ),
}

# Where a site serves the hub or PyPI under other names (an internal mirror, or
# the lab): {"real id or requirement": "replacement"}. Revisions travel with repos
# as "repo@commit".
mirrors = dict(repos={}, requirements={})

hf_endpoint = None  # None: the public hub; set for a private hub or mirror
# True: accept a plain-HTTP hf_endpoint. The token then travels in clear, and whoever is on the path
# serves the weights and the hashes they are checked against.
allow_http_hub = False
hf_token_env = "HF_TOKEN"  # read on the controller; else its huggingface_hub token file
# If set on the controller, the server requires this key (/etc/specfleet/api-key: root's, 0640, the service group reads it). Unset,
# a key already on the host stays; only remove_api_key=true removes it.
api_key_env = "SPECFLEET_API_KEY"
remove_api_key = False
pip_index_url = None  # None: PyPI
# True: accept a plain-HTTP pip_index_url; whoever is on the path then serves the packages that uv
# installs as root (a git build's, and the client's, unchecked by any hash).
allow_http_index = False

service_name = "sglang"  # each replica's unit is SERVICE_NAME@DEPLOYMENT-gpuGPUS, e.g. sglang@qwen36_ddtree-gpu3
service_user = "sglang"  # runs the servers, the flag check and the bench client: the model's code
# Owns the HF token and the weights it downloads (the service user reads them through its group, never
# the token): the model's code, which runs as the service user, cannot read the token.
download_user = "sglang-download"
install_dir = "/opt/specfleet"  # virtualenvs, host-side scripts
weights_dir = "/srv/specfleet/models"  # a directory per repo, in it one per revision (commit)
config_dir = "/etc/specfleet"  # unit environment file; the API key (0640, root:<service group>)
# Loopback: only the host itself (or a gateway on it) reaches the server. Any other address
# needs an API key: preflight refuses a server reachable beyond loopback without one.
bind_address = _network.LOOPBACK
# Each replica's unit admits packets (both ways) from loopback, its node group and the run's gateways that
# route it alone (IPAddressDeny=any): torch's TCPStore on nccl_port listens on every address. Add the
# networks its clients or what it reaches are on (['any'] lifts the list: FlashInfer's first-use kernel
# downloads from NVIDIA, direct clients of an exposed server); docs/security.md.
server_ip_allow = []
port = 30000  # each replica listens on port + the index of its lowest GPU
# Each replica's TCPStore (SGLang's --nccl-port): nccl_port + the index of its lowest GPU. Without it
# SGLang draws one in 22000-29999, tests it and binds it later, so replicas starting together can
# draw the same (srt/utils/network.py); the dist-init port (node_groups) and smg's Prometheus port
# lie in that range too. 31000-31007: above it, below the kernel's ephemeral ports (32768 and up).
nccl_port = 31000
enable_metrics = True  # /metrics with sglang:spec_accept_length

# Preflight refuses a replica whose KV cache, as SGLang will size it from the model's config.json and the
# card's memory (deployment/server/capacity.py), holds fewer tokens than this. None: one full context of
# its model (its --context-length, else the target's max_position_embeddings).
min_kv_tokens = None
ready_timeout_s = None  # None: from the weights' size (readiness.ready_timeout: 300 s + 400 MB/s, ~30 min for 595 GB)
# The longest generation a request may take. A stop waits for the requests in flight: the drain
# behind a gateway waits this long for the server to go idle before stopping it, and SGLang, which
# has no drain limit of its own, finishes what is left after systemd's SIGTERM; the unit's stop
# timeout is this plus SGLang's own shutdown (deployment/server/config.py SHUTDOWN_S), after which systemd
# kills what remains. 900 s: a 64K-token answer at 73 tokens/s, the low end of what the community
# recipe measured for Kimi K2.5 on 8 RTX PRO 6000 without speculation (local-inference-lab/rtx6kpro,
# models/kimi-k25.md); speculation only shortens it. Raise it if your clients ask for longer answers.
longest_generation_s = 900
verify_weights = False  # True (or --data verify_weights=true): hash every file against the hub
# Hosts of one run deploying the same revision take its files from each other, each file from the hub once
# (deployment/weights/fanout.py); False: every host fetches every file from the hub.
weights_fanout = True
# Where a host serves its revisions to its peers (nginx, read-only, to the run's peers only): above the
# servers' ports (port + GPU index, 30000-30007), below nccl_port's (31000-31007).
weights_fanout_port = 30900
weights_cache = False  # True: a host keeps serving its revisions to its peers after the run (a site cache)
install_driver = False  # True: install the open-module driver branch below (reboots if it changed)
driver_branch = "580"
# NVIDIA's apt repositories (the driver, fabric manager, nvlsm), per OS release and architecture below it.
nvidia_repo_url = "https://developer.download.nvidia.com/compute/cuda/repos"
# True: accept a plain-HTTP nvidia_repo_url. Its keyring then travels unprotected, and whoever swaps it
# can sign any package apt installs as root.
allow_http_nvidia_repo = False
allow_branch_revisions = False  # True: a branch revision only warns (the weights follow the branch)
# Seconds the GPU smoke test's all-reduce may take, start-up included (the P2P attempt on a PCIe
# class gets a third of it): 8 GPUs start NCCL and run in ~10-30 s; a real 2x H200 run took 6.2 s.
gpu_smoke_timeout_s = 180
# The commits that moving revisions (a branch, a tag, a pull request's ref) point at, as `python pin.py
# INVENTORY` resolved them into SPECFLEET_SITE/pins.json: {"repos": {"REPO@REVISION": COMMIT}, "git":
# {"URL@REF": COMMIT}}. The deploy installs and fetches those commits; preflight refuses a moving
# revision without one.
pins = _site_data.pins()

# One model over several nodes: a server spanning hosts, tensor parallel over all their GPUs
# (e.g. Kimi K2.6 at TP 16 over two 8-GPU B200 nodes). A host joins a group with its inventory
# data `node_group` (a key below) and `node_rank`: rank 0 runs the HTTP server (health-checked,
# registered with a gateway), the others join it over rank 0's `dist_init_port` (torch's TCP
# store; with attention DP also the 6 ports after it; NCCL picks its own ports between all the
# nodes: open the node network between them, and keep it private, as nothing there takes a key).
# The members: every inventory host naming the group, one class and one profile, ranks 0..N-1
# (inventory/b200.py: SPECFLEET_B200_NODE_GROUP). Each host's `node_address` is its IP on the
# node network (else its ssh_hostname, if that is an IP).
node_groups = {
    "kimi-tp16": dict(
        tp_size=16,  # over all the nodes: tp_size / nodes GPUs on each (8 on a B200 node)
        dist_init_port=25000,
        socket_ifname=None,  # NCCL_SOCKET_IFNAME/GLOO_SOCKET_IFNAME, e.g. "ens1f0"; None: NCCL/Gloo pick
    ),
}
node_group = None  # this host serves alone
node_rank = None
node_address = None

# SPECFLEET_SITE/group_data/all.py (your site directory, outside this checkout) overrides these values
# (deployment/site_data.py).
globals().update(_site_data.overrides(__file__, globals()))
