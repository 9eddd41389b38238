"""Hosts of the `gateway` group: SGLang's model gateway (smg) in front of the inventory's workers.

A gateway host needs no GPU (it skips every GPU stage); a GPU host may also be in this
group and carry the gateway beside its server. The gateway serves the model of the
host's `profile` (group_data/all.py) and routes to every inventory host in a class
group serving that model, registered through its own API (operations/gateway/registry.py).
"""

from deployment import network as _network, site_data as _site_data

# The gateway itself: the real smg wheel (a Rust gateway shipped as a Python package).
# Never also install sglang-router: both ship an `smg` console script.
gateway_requirement = "smg==1.13.0"
gateway_service_name = "smg"
gateway_user = "smg"

# Where clients reach it. Loopback unless a key is set on the controller (api_key_env):
# with a key, e.g. --data gateway_bind_address=0.0.0.0. That key is the clients': smg forwards a
# client's key to the worker it picks, so the workers take the same one.
gateway_bind_address = _network.LOOPBACK
# The control plane's key, on the controller in this variable: registering and removing workers
# (POST/DELETE /workers, smg --control-plane-api-keys, role admin) takes it, and smg then refuses
# the clients' key there, so a client cannot register a worker of its own and receive others'
# prompts. Required once the gateway has a client key; it must differ from it. The deploy writes it
# on the gateway host alone (root's): every worker's drain and registration runs there.
gateway_admin_key_env = "SPECFLEET_GATEWAY_ADMIN_KEY"
gateway_port = 30080
# Prometheus text on its own port (smg_worker_health, smg_router_requests_total, ...); it takes
# no key, so it listens on loopback only, where the gateway host's Prometheus scrapes it.
gateway_prometheus_port = 29000

# cache_aware sends a prompt to the worker whose radix cache holds its longest prefix
# (balanced by load): speculative decoding gains nothing on a cold cache.
gateway_policy = "cache_aware"

# Worker health checks (smg --health-*), fitted to SGLang 0.5.23's /health: it runs a one-token
# generation through the scheduler and polls for it every second, so it takes at least 1 s; on a
# busy server it waits for the batch in progress (a long prefill chunk) and answers 503 only after
# SGLANG_HEALTH_CHECK_TIMEOUT (20 s) without progress, marking the server UnHealthy (which also
# skips its drain on SIGTERM). A shorter probe timeout fails busy workers that are fine
# (sgl-project/sglang#22511: long chunked prefills failing health checks). So:
# - timeout 25 s: past SGLang's own 20 s, so smg hears SGLang's verdict; a timeout means a server
#   that cannot answer at all. smg runs one probe per worker at a time, so a slow one delays the next.
# - failure_threshold 3: one spurious 503 does not take a worker out; three in a row (a scheduler
#   stalled a minute or more) do. Dead servers are also caught by smg's circuit breaker on requests.
# - interval 10 s, success_threshold 2: a registered or recovered worker is routed to within ~10 s.
# /ready would cost nothing but never notices a hung scheduler, as it runs no generation.
gateway_health = dict(
    endpoint="/health",
    interval_secs=10,
    timeout_secs=25,
    failure_threshold=3,
    success_threshold=2,
)
# How long a registered worker may take to become `ready` on the gateway.
gateway_register_timeout_s = 120

# Prometheus (Debian's `prometheus` package) on the gateway host, scraping every worker's /metrics
# and smg's Prometheus port (operations/monitoring.py). It has no key, so it listens on loopback
# only: query it on the host (`curl localhost:9090/api/v1/query ...`) or through an SSH tunnel.
prometheus_listen_address = _network.LOOPBACK
prometheus_port = 9090  # Debian's default
prometheus_scrape_interval_s = 15
prometheus_retention = "15d"  # Prometheus's default; a worker's few dozen series take little disk
# How long the deploy waits for every target's first successful scrape after a change.
prometheus_targets_timeout_s = 60

# SPECFLEET_SITE/group_data/gateway.py (your site directory, outside this checkout) overrides these values
# (deployment/site_data.py).
globals().update(_site_data.overrides(__file__, globals()))
