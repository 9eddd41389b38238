"""Runs ON THE HOST as the gateway unit's ExecStart: `smg launch ARGS` plus its keys.

The clients' key (SPECFLEET_API_KEY_FILE, smg --api-key) and the control plane's admin key
(SPECFLEET_ADMIN_KEY_FILE, smg --control-plane-api-keys, role admin) are read from their root-owned
files and handed to smg's own CLI inside this process, so neither is in the unit file or in `ps` (the
kernel keeps the exec-time argv; smg then retitles the process `smg::router`). With a control-plane
key, smg takes only it on /workers (and the clients' key only on the data plane). smg logs its
configuration without the keys (checked in tests/lab/test_gateway.py).
"""

import os
import sys
from pathlib import Path

from smg.cli import main


def read_key(variable: str) -> str:
    path = Path(os.environ.get(variable, "/nonexistent"))
    return path.read_text().strip() if path.is_file() else ""


key, admin_key = read_key("SPECFLEET_API_KEY_FILE"), read_key("SPECFLEET_ADMIN_KEY_FILE")
main(["launch", *sys.argv[1:], *(["--api-key", key] if key else []),
      # id:name:role:key, split on its first three colons (smg/router_args.py)
      *(["--control-plane-api-keys", f"specfleet:deploy:admin:{admin_key}"] if admin_key else [])])
