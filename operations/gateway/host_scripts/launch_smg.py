"""Runs ON THE HOST as the gateway unit's ExecStart: `smg launch ARGS` plus the API key.

The key is read from the 0600 file named by SPECFLEET_API_KEY_FILE and handed to smg's
own CLI inside this process, so it is never in the unit file or in `ps` (the kernel
keeps the exec-time argv; smg then retitles the process `smg::router`). smg logs its
configuration without the key (checked in tests/lab/test_gateway.py).
"""

import os
import sys
from pathlib import Path

from smg.cli import main

key_file = Path(os.environ.get("SPECFLEET_API_KEY_FILE", "/nonexistent"))
key = key_file.read_text().strip() if key_file.is_file() else ""
main(["launch", *sys.argv[1:], *(["--api-key", key] if key else [])])
