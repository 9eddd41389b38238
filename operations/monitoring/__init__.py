"""Prometheus (Debian's package) on gateway hosts, scraping smg and the gateway's workers."""
