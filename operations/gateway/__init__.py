"""SGLang's model gateway (smg) on the `gateway` group's hosts: its configuration, its own service and
key, and its workers (who they are, draining and rejoining around a restart, registration)."""
