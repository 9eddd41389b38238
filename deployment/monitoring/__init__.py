"""Prometheus on the gateway's hosts: its settings (config)."""
