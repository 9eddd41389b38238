"""A deploy file (deploy.py, bench.py, ...) named as a module's file, so that pyinfra orders its operations
without scanning every loaded module for it.

pyinfra's CLI orders each operation call by the stack it is called from
(`pyinfra.api.util.get_operation_order_from_stack`: `inspect.stack()`, then `getframeinfo` of each frame
twice). `inspect` finds a frame's module by the frame's file, and a deploy file, which pyinfra runs with
`exec`, is no module's file: each lookup of its frame scans `sys.modules` (about 940 modules in a no-op),
three per operation call, 0.2-0.5 s of a no-op re-run of three lab hosts on a 2-core controller
(speed/README.md, P1). Once a module names the file, each lookup is one dictionary hit.
"""

import sys
import types


def named_for_inspect(path: str) -> None:
    """Give the deploy file at `path` a module of its own in `sys.modules` (under a name nothing can import);
    once per file, whichever host's run of it asks first.

        deploy_files.named_for_inspect(__file__)  # first line of a deploy file
    """
    name = f"specfleet deploy file {path}"
    if name not in sys.modules:
        module = types.ModuleType(name)
        module.__file__ = path
        sys.modules[name] = module
