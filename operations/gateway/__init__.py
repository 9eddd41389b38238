"""SGLang's model gateway (smg) on the `gateway` group's hosts (its settings and workers:
deployment/gateway/): its own service and keys (service), smg's worker API driven on its host (registry), and a
worker leaving and rejoining it around a restart (drain)."""
