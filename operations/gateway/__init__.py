"""SGLang's model gateway (smg) on the `gateway` group's hosts: its configuration (config), its own service
and keys (service), which workers it routes to and where (membership), smg's worker API driven on its
host (registry), and a worker leaving and rejoining it around a restart (drain)."""
