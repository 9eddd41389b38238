"""Runs INSIDE the real-SGLang env (tests/sglang_real.py starts it): the real SGLang 0.5.23
resolves command lines as on a host of a given class, by running the deploy's own host-side
check (operations.sglang.RESOLVE, passed in argv[1]) with that class's GPU presented to it.

Input on stdin: a JSON list of cases {"argv": [...], "env": {...}, "gpu": {"name", "compute_capability",
"count", "memory_mib"}}. Output: one line "@@CASES@@" + a JSON list of RESOLVE's answers.

What is replaced, and why (nothing else is; every SGLang hook runs as released):
- This machine has no NVIDIA GPU, so the functions through which SGLang and torch ASK THE DRIVER
  about the GPU answer with the class's GPU instead: torch.cuda.is_available, device_count,
  current_device, get_device_capability, get_device_name, get_device_properties, mem_get_info, and
  sglang.srt.utils.common.get_nvgpu_memory_capacity (which runs `nvidia-smi --query-gpu=memory.total`).
  From these SGLang derives its own platform facts (is_cuda, is_sm100, is_blackwell, device_sm, ...).
- SGLang's modules are imported BEFORE the GPU appears: with a GPU visible at import time they
  load CUDA kernel libraries (sgl_kernel, flashinfer), which need the driver itself. Resolution
  asks for the device at call time, so the cached answers from import time are cleared
  (cache_clear on sglang.srt.utils.common's lru_cache'd probes) once the GPU is presented.
Each case resolves in a fork of one warmed process: the import costs seconds, and resolution
writes process state (os.environ, caches) that must not leak from one case into the next.
"""

import importlib
import json
import os
import pkgutil
import sys
from collections import namedtuple

import torch

import sglang.srt.arg_groups
import sglang.srt.utils.common as common

# Modules the resolution hooks import inside their functions, imported here while no GPU is visible.
HOOK_MODULES = [info.name for info in pkgutil.walk_packages(sglang.srt.arg_groups.__path__, "sglang.srt.arg_groups.")]
HOOK_MODULES += ["sglang.srt.model_loader", "sglang.srt.kernel_plugins.nvidia.binding",
                 "sglang.srt.kernel_plugins.amd.binding"]
# And what the check's startup arithmetic imports (RESOLVE's `startup`).
HOOK_MODULES += ["sglang.srt.mem_cache.kv_cache_configurator", "sglang.srt.model_executor.pool_configurator",
                 "sglang.srt.configs.model_config", "sglang.srt.mem_cache.kv_cache_dtype",
                 "sglang.srt.model_executor.model_runner_components.layer_setup",
                 "sglang.srt.model_executor.model_runner_components.spec_aux_hidden_state",
                 "sglang.srt.runtime_context", "sglang.srt.speculative.spec_info"]
for module in HOOK_MODULES:
    importlib.import_module(module)

MIB = 1 << 20
DeviceProperties = namedtuple("DeviceProperties", "name major minor total_memory multi_processor_count")


def present_gpu(gpu: dict) -> None:
    """The class's GPUs, as the CUDA driver would describe them."""
    major, minor = (int(part) for part in gpu["compute_capability"].split("."))
    memory = gpu["memory_mib"] * MIB
    properties = DeviceProperties(gpu["name"], major, minor, memory, 148)  # SM count: not read by resolution
    torch.cuda.is_available = lambda: True
    torch.cuda.device_count = lambda: gpu["count"]
    torch.cuda.current_device = lambda: 0
    torch.cuda.get_device_capability = lambda device=None: (major, minor)
    torch.cuda.get_device_name = lambda device=None: gpu["name"]
    torch.cuda.get_device_properties = lambda device=None: properties
    torch.cuda.mem_get_info = lambda device=None: (memory, memory)
    common.get_nvgpu_memory_capacity = lambda: float(gpu["memory_mib"])
    for value in vars(common).values():
        if hasattr(value, "cache_clear"):
            value.cache_clear()


def run_case(resolve, case: dict) -> dict:
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_end)
        try:
            os.environ.update(case.get("env", {}))
            present_gpu(case["gpu"])
            # The host check's sizing where the case has one (operations.server.flags.RESOLVE's second argument).
            result = resolve(case["argv"], case["sizing"]) if "sizing" in case else resolve(case["argv"])
        except BaseException as exc:  # a crash of the harness itself, not SGLang's answer
            result = {"harness_error": f"{type(exc).__name__}: {exc}"}
        with os.fdopen(write_end, "w") as out:
            json.dump(result, out, default=repr)
        os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end) as answer:
        text = answer.read()
    os.waitpid(pid, 0)
    return json.loads(text) if text else {"harness_error": "the resolving process died"}


def main() -> None:
    namespace = {"__name__": "specfleet_resolve"}
    exec(compile(sys.argv[1], "operations.sglang.RESOLVE", "exec"), namespace)
    cases = json.load(sys.stdin)
    os.environ["HF_HUB_OFFLINE"] = "1"  # as the host check runs: model folders only, no hub
    print("@@CASES@@" + json.dumps([run_case(namespace["resolve"], case) for case in cases]), flush=True)


if __name__ == "__main__":
    main()
