"""SGLang's model gateway (smg) on the `gateway` group's hosts: its settings (config), and which workers it
routes to and where (membership)."""
