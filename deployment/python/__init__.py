"""What a requirement pins: its committed hash lock and the fingerprint naming its virtualenv (pinned)."""
