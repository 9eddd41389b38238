"""The model's weights: the hub (token, access, commits, listings), the token on the host, downloads
by units that survive a dropped connection, verification and the manifest, and the disk they need."""
