"""The GPU smoke test before SGLang starts: a short NCCL all-reduce across all of the host's GPUs.

host_scripts/gpu_smoke.py does the work on the host with the SGLang venv's own torch and the
unit's NCCL environment, under a timeout, and records its result on the host (SMOKE_RECORD in
the install directory) where tests/deployed checks it.
"""

from __future__ import annotations

import hashlib
import json
import shlex

from pyinfra import host
from pyinfra.api import FactBase, FunctionCommand, operation
from typing_extensions import override

from dataclasses import dataclass

from operations.basics import gathering, shell
from operations.gpu.config import GpuExpectations

SMOKE_RECORD = "gpu-smoke.json"


@dataclass(frozen=True)
class SmokeTest:
    """The GPU smoke test of one host: its GPUs' floor, and the SGLang build and environment it runs with."""

    expected: GpuExpectations  # the bus bandwidth floor
    venv: str  # the SGLang virtualenv: its torch and NCCL
    install_dir: str  # where gpu_smoke.py is and its record goes
    env: dict[str, str]  # the unit's environment (NCCL's settings)
    build: str  # the SGLang requirement: a new build is tested again
    engine: str | None  # None: gpu_smoke.py's own torch.distributed + NCCL workers; else a program's path

    @property
    def record_path(self) -> str:
        return f"{self.install_dir}/{SMOKE_RECORD}"


class GpuSmokeRecord(FactBase):
    """
    Returns this boot's id and the smoke test's record (gpu_smoke.py's JSON; None when absent).

    .. code:: python

        {
            "boot_id": "5e0c8c1e-...",
            "record": {"verdict": "passed", "busbw_gbps": 331.5, "boot_id": "5e0c8c1e-...", "key": "...", ...},
        }
    """

    host_answer = "gpu_state.smoke_record"

    @override
    def command(self, path: str) -> str:
        return f"cat /proc/sys/kernel/random/boot_id; cat {shlex.quote(path)} 2>/dev/null || true"

    @override
    def process(self, output: list[str]) -> dict:
        try:
            record = json.loads(output[1])
        except (IndexError, ValueError):
            record = None
        return dict(boot_id=output[0].strip() if output else None,
                    record=record if isinstance(record, dict) else None)


def smoke_key(smoke: SmokeTest) -> str:
    """What the recorded result depends on besides the boot: SGLang's build (its torch, NCCL), the
    NCCL environment, the floor and the engine. A change in any of them means test again."""
    inputs = [smoke.build, sorted(smoke.env.items()), smoke.expected.allreduce_floor_gbps, smoke.engine]
    return hashlib.sha1(json.dumps(inputs).encode()).hexdigest()


def smoke_command(smoke: SmokeTest, timeout_s: int) -> str:
    t = smoke  # its values were checked by resolve() before any shell sees them
    argv = [
        "env", *(f"{name}={value}" for name, value in sorted(t.env.items())),
        f"{t.venv}/bin/python", f"{t.install_dir}/bin/gpu_smoke.py",
        "--floor-gbps", str(float(t.expected.allreduce_floor_gbps)), "--timeout", str(int(timeout_s)),
        "--record", t.record_path, "--key", smoke_key(t), *(["--engine", t.engine] if t.engine else []),
    ]
    return " ".join(shlex.quote(part) for part in argv)


def summary(record: dict) -> str:
    """One line per host: the verdict, bus bandwidth by message size, the floor, what measured it."""
    sizes = ", ".join(f"{result['bytes'] >> 20} MiB {result['busbw_gbps']:g}" for result in record.get("results", []))
    line = f"GPU smoke test {record.get('verdict')}: {record.get('gpus')} GPUs"
    if sizes:
        line += (f", all-reduce bus bandwidth GB/s {sizes} (floor {record.get('floor_gbps'):g}) by "
                 f"{record.get('engine')} in {record.get('seconds')} s")
    return line + (f": {record['reason']}" if record.get("reason") else "")


def _run_smoke_test(state, host, command: str) -> bool:
    _, output = shell.run(host, command)
    record = GpuSmokeRecord().process(["", *output.stdout_lines[-1:]])["record"]
    if record is None:
        host.log_styled(f"GPU smoke test printed no record: {' '.join(output.stdout_lines)[-300:]}", fg="red")
        return False
    passed = record.get("verdict") in ("passed", "skipped")
    host.log_styled(summary(record), fg="green" if passed else "red")
    return passed


@operation()
def allreduce(smoke: SmokeTest, timeout_s: int = 180):
    """
    Prove the GPUs can run SGLang's collectives before a long model load: a short NCCL all-reduce
    across all of them with the SGLang venv's torch and the unit's NCCL environment, under a
    timeout (a hanging P2P path fails here, not half an hour later), its bus bandwidth checked
    against the class's ``allreduce_floor_gbps`` (an NVLink board on a PCIe path fails too).
    The result is printed and recorded on the host; it is tested again after a reboot or when
    SGLang's build, the NCCL environment, the floor or the engine change.

    + smoke: the host's smoke test (venv, install directory, NCCL env, GPU floor, engine)
    + timeout_s: seconds the all-reduce may take, start-up included

    **Example:**

    .. code:: python

        from operations.gpu import smoke
        smoke.allreduce(name="GPU smoke test", smoke=deployment.smoke)
    """
    found = gathering.read(GpuSmokeRecord, path=smoke.record_path)
    record = found["record"] or {}
    if (record.get("verdict") in ("passed", "skipped") and record.get("key") == smoke_key(smoke)
            and record.get("boot_id") == found["boot_id"]):
        host.log_styled(summary(record), fg="green")
        host.noop("the GPU smoke test passed in this boot with this SGLang and NCCL environment")
        return
    yield FunctionCommand(_run_smoke_test, (smoke_command(smoke, timeout_s),), {})


@gathering.wants
def _read(deployment, snapshots) -> gathering.Wanted:
    return [(GpuSmokeRecord, dict(path=deployment.smoke.record_path))]
