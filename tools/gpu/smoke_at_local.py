"""The deploy's GPU smoke test on the GPU host itself, for `python -m tools.gpu capture`.

    SPECFLEET_SMOKE_INSTALL_DIR=DIR SPECFLEET_SMOKE_CLASS=b200_nvlink pyinfra -y @local tools/gpu/smoke_at_local.py

DIR/bin holds operations/gpu/host_scripts/gpu_smoke.py and DIR/sglang-venv is the python that holds torch (the
capture sets both up: such a host has no SGLang venv). The class gives the floor; the NCCL
environment is the class's with NVLink multicast off (NO_MULTICAST: some shared hosts forbid it).
"""

import dataclasses
import os
import runpy
from types import SimpleNamespace

from deployment import hosts
from operations.gpu import smoke
from tools.gpu.capture import NO_MULTICAST

class_name = os.environ["SPECFLEET_SMOKE_CLASS"]
# The host is @local, in no inventory group: merge its group data as pyinfra would (all, then the class).
data = {**runpy.run_path("group_data/all.py"), **runpy.run_path(f"group_data/{class_name}.py")}
data["install_dir"] = os.environ["SPECFLEET_SMOKE_INSTALL_DIR"]
test = hosts.resolve(SimpleNamespace(**data), class_name).smoke
# As the user running the capture: a GPU host lent for it has no service user.
smoke.allreduce(name="GPU smoke test", smoke=dataclasses.replace(test, env={**test.env, **NO_MULTICAST}, user=None))
