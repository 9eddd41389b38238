"""Hosts of the `gateway` group: SGLang's model gateway (smg) in front of the inventory's workers.

A gateway host needs no GPU (it skips every GPU stage); a GPU host may also be in this
group and carry the gateway beside its server. The gateway serves the model of the
host's `profile` (group_data/all.py) and routes to every inventory host in a class
group serving that model, registered through its own API (operations/gateway.py).
"""

from operations.deployment import site as _site

# The gateway itself: the real smg wheel (a Rust gateway shipped as a Python package).
# Never also install sglang-router: both ship an `smg` console script.
gateway_requirement = "smg==1.13.0"
gateway_service_name = "smg"
gateway_user = "smg"

# Where clients reach it. Loopback unless a key is set on the controller (api_key_env):
# with a key, e.g. --data gateway_bind_address=0.0.0.0. The same key guards the gateway's
# admin routes (POST/DELETE /workers) and is passed on to the workers.
gateway_bind_address = "127.0.0.1"
gateway_port = 30080
# Prometheus text on its own port (smg_worker_health, smg_router_requests_total, ...); it takes
# no key, so it listens on 127.0.0.1 only, where the gateway host's Prometheus scrapes it.
gateway_prometheus_port = 29000

# cache_aware sends a prompt to the worker whose radix cache holds its longest prefix
# (balanced by load): speculative decoding gains nothing on a cold cache.
gateway_policy = "cache_aware"

# Worker health checks (smg --health-*): SGLang's /health generates one token, so a
# check every 10 s costs little; 3 failures in a row take a worker out, 2 successes back.
gateway_health = dict(
    endpoint="/health",
    interval_secs=10,
    timeout_secs=5,
    failure_threshold=3,
    success_threshold=2,
)
# How long a registered worker may take to become `ready` on the gateway.
gateway_register_timeout_s = 120

# Prometheus (Debian's `prometheus` package) on the gateway host, scraping every worker's /metrics
# and smg's Prometheus port (operations/monitoring.py). It has no key, so it listens on loopback
# only: query it on the host (`curl localhost:9090/api/v1/query ...`) or through an SSH tunnel.
prometheus_listen_address = "127.0.0.1"
prometheus_port = 9090  # Debian's default
prometheus_scrape_interval_s = 15
prometheus_retention = "15d"  # Prometheus's default; a worker's few dozen series take little disk
# How long the deploy waits for every target's first successful scrape after a change.
prometheus_targets_timeout_s = 60

# SPECFLEET_SITE/group_data/gateway.py (your site directory, outside this checkout) overrides these values
# (operations/deployment/site.py).
globals().update(_site.overrides(__file__, globals()))
