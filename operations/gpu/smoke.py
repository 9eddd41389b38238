"""The GPU smoke test before SGLang starts: a short NCCL all-reduce across all of the host's GPUs, which
also decides, on a PCIe class, whether NCCL may use peer-to-peer on this host.

host_scripts/gpu_smoke.py does the work on the host, as the service user (whatever the unit's
environment holds reaches no process of root's), with the SGLang venv's own torch and the unit's
NCCL environment, under a timeout. Root records its result on the host (deployment/gpu/config.py's SMOKE_RECORD in
the install directory), where later runs and tests/deployed read it. The P2P decision in it reaches
the SGLang unit through `decided_env` alone.
"""

from __future__ import annotations

import hashlib
import json
import shlex

from pyinfra import host
from pyinfra.api import FactBase, FunctionCommand, operation
from typing_extensions import override

from deployment.gpu.config import SmokeTest
from operations.basics import gathering, shell

# The P2P decisions gpu_smoke.py makes by measuring (the others are the class's or the environment's).
MEASURED = ("measurement", "an earlier measurement")
P2P_OFF = {"NCCL_P2P_DISABLE": "1"}


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
    NCCL environment and the floors. A change in any of them means test again."""
    inputs = [smoke.build, sorted(smoke.env.items()), smoke.expected.allreduce_floor_gbps,
              smoke.expected.p2p_floor_gbps]
    return hashlib.sha1(json.dumps(inputs).encode()).hexdigest()


def smoke_command(smoke: SmokeTest) -> str:
    t = smoke  # its values were checked by resolve() before any shell sees them
    p2p = t.expected.p2p_floor_gbps
    argv = [
        *(["runuser", "-u", t.user, "--"] if t.user else []),
        "env", *(f"{name}={value}" for name, value in sorted(t.env.items())),
        f"{t.venv}/bin/python", f"{t.install_dir}/bin/gpu_smoke.py",
        "--floor-gbps", str(float(t.expected.allreduce_floor_gbps)), "--timeout", str(int(t.timeout_s)),
        *(["--p2p-floor-gbps", str(float(p2p)), "--p2p-timeout", str(int(t.timeout_s) // 3)] if p2p else []),
        "--previous", t.record_path, "--key", smoke_key(t),
    ]
    # From /: the service user may not enter the SSH user's home.
    return "cd / && " + " ".join(shlex.quote(part) for part in argv)


def summary(record: dict) -> str:
    """One line per host: the verdict, bus bandwidth by message size, the floor, what measured it."""
    sizes = ", ".join(f"{result['bytes'] >> 20} MiB {result['busbw_gbps']:g}" for result in record.get("results", []))
    line = f"GPU smoke test {record.get('verdict')}: {record.get('gpus')} GPUs"
    if sizes:
        line += (f", all-reduce bus bandwidth GB/s {sizes} (floor {record.get('floor_gbps'):g}) by "
                 f"{record.get('engine')} in {record.get('seconds')} s")
    return line + (f": {record['reason']}" if record.get("reason") else "")


def p2p_off(record: dict | None) -> dict | None:
    """The record's P2P decision when a measurement turned P2P off on this host, else None."""
    p2p = (record or {}).get("p2p")
    return p2p if isinstance(p2p, dict) and p2p.get("enabled") is False and p2p.get("decided_by") in MEASURED else None


def p2p_line(record: dict, record_path: str) -> str | None:
    """One line where P2P was turned off on this host: why, the likely cause and the fix; None otherwise."""
    p2p = p2p_off(record)
    if p2p is None:
        return None
    since = f" (since {p2p.get('decided_at')})" if p2p["decided_by"] != "measurement" else ""
    return (f"NCCL P2P off on this host{since}: {p2p.get('reason')}; likely PCIe ACS or the IOMMU routing peer-to-peer "
            "traffic through the CPU (NVIDIA/nccl#1999, #2079; NCCL's troubleshooting guide): turn ACS and the "
            "IOMMU off in the BIOS (or boot with pci=noacs), then remove "
            f"{record_path} and deploy again to try P2P again; meanwhile SGLang runs with NCCL_P2P_DISABLE=1")


def unit_env(record: dict | None) -> dict[str, str]:
    """What the smoke test's P2P decision adds to the SGLang unit's environment: NCCL_P2P_DISABLE=1 where
    a measurement turned P2P off on this host, else nothing."""
    return dict(P2P_OFF) if p2p_off(record) else {}


def decided_env(smoke: SmokeTest) -> dict[str, str]:
    """The one way the P2P decision reaches the SGLang unit: `unit_env` of the host's record, read
    through the gathering (a no-op run asks the host nothing more), as the unit's restart decision
    takes it (operations.server.unit.Restart)."""
    return unit_env(gathering.read(GpuSmokeRecord, path=smoke.record_path)["record"])


def _run_smoke_test(state, host, command: str, record_path: str) -> bool:
    _, output = shell.run(host, command)
    record = GpuSmokeRecord().process(["", *output.stdout_lines[-1:]])["record"]
    if record is None:
        host.log_styled(f"GPU smoke test printed no record: {' '.join(output.stdout_lines)[-300:]}", fg="red")
        return False
    # Root writes the record: the test ran as the service user, who cannot write in root's directory.
    written = shell.write_readable(host, record_path, json.dumps(record))  # the record holds no secret
    passed = record.get("verdict") in ("passed", "skipped") and written
    host.log_styled(summary(record), fg="green" if passed else "red")
    if line := p2p_line(record, record_path):
        host.log_styled(line, fg="yellow")
    return passed


@operation()
def allreduce(smoke: SmokeTest):
    """
    Prove the GPUs can run SGLang's collectives before a long model load: a short NCCL all-reduce
    across all of them with the SGLang venv's torch and the unit's NCCL environment, as the service
    user, under a timeout (a hanging P2P path fails here, not half an hour later), its bus bandwidth
    checked against the class's ``allreduce_floor_gbps`` (an NVLink board on a PCIe path fails too).
    On a PCIe class (``p2p_floor_gbps``) it tries peer-to-peer first: a hang, an error or a bus
    bandwidth below that floor turns P2P off for the host, which SGLang's unit then gets
    (``decided_env``); the line saying so names the likely cause and the fix.
    The result is printed and recorded on the host; it is tested again after a reboot or when
    SGLang's build, the NCCL environment or the floors change.

    + smoke: the host's smoke test (venv, install directory, NCCL env, GPU floors, user, timeout)

    **Example:**

    .. code:: python

        from operations.gpu import smoke
        smoke.allreduce(name="GPU smoke test", smoke=worker.smoke)
    """
    found = gathering.read(GpuSmokeRecord, path=smoke.record_path)
    record = found["record"] or {}
    if (record.get("verdict") in ("passed", "skipped") and record.get("key") == smoke_key(smoke)
            and record.get("boot_id") == found["boot_id"]):
        host.log_styled(summary(record), fg="green")
        if line := p2p_line(record, smoke.record_path):
            host.log_styled(line, fg="yellow")
        host.noop("the GPU smoke test passed in this boot with this SGLang and NCCL environment")
        return
    yield FunctionCommand(_run_smoke_test, (smoke_command(smoke), smoke.record_path), {})


@gathering.wants
def _read(deployment) -> gathering.Wanted:
    return [(GpuSmokeRecord, dict(path=deployment.host.smoke.record_path))]
