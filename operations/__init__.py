"""specfleet's pyinfra operations and facts, by subject."""

import sys

# pyinfra's CLI turns off writing bytecode for its whole process (pyinfra_cli/main.py sets
# sys.dont_write_bytecode), so every deploy run compiled these ~100 modules from source again: 0.16-0.20 s
# of the controller's CPU in each no-op re-run of three lab hosts, before any host program could leave
# (speed/README.md, P1). They keep their compiled files as the interpreter was told at its start: -B or
# PYTHONDONTWRITEBYTECODE still turns writing off.
sys.dont_write_bytecode = sys.flags.dont_write_bytecode
