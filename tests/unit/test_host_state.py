"""The one-round-trip host program (operations/basics/host_scripts/host_state.py) answers each fact as that
fact's own command does: both run here, side by side, on the same files, units, venvs and GPU
stand-in (which answers from real captures), and each fact's process() reads both; the GPU parts it
derives from one `nvidia-smi -q` are checked against the facts a real H200 host gave."""

import hashlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from pyinfra.facts.server import Arch, LinuxDistribution

from operations.basics import gathering
from operations.basics.file_states import DIGEST_KEY, FileStates, digest_of
from operations.basics.file_states import UserFileStates
from operations.basics.host_programs import HOST_SCRIPTS
from operations.basics.ownership import SystemUser
from operations.basics.units import ServiceState
from operations.gpu.facts import NvidiaDriver, NvidiaFabric, NvidiaGpus, NvidiaTopology, RebootPending
from operations.gpu.smoke import GpuSmokeRecord
from operations.python.virtualenvs import MARKER, VenvRequirement, VenvsUsed
from operations.run.preflight import LoginUser
from operations.server.readiness import ServerProbe
from tests.gpu_standin_env import gpu_standin_env
from tests.helpers import host_programs_importable

REPO = Path(__file__).resolve().parents[2]
CAPTURES = REPO / "tests" / "fixtures" / "nvidia-smi"


def own_command(fact, env: dict, **kwargs):
    """The fact as pyinfra reads it: its command's output lines (exit 0), else its default."""
    # What the fact names for its stdin (the digest key of the file states), as gathering.read passes it.
    out = subprocess.run(["sh", "-c", fact().command(**kwargs)], capture_output=True, text=True, env=env,
                         input=getattr(fact, "stdin", None))
    lines = out.stdout.splitlines()
    return fact().process(lines) if out.returncode == 0 and lines else fact.default()


def host_program(wanted: list, env: dict) -> dict:
    """gathering.answered's parsing of the host program run here on `wanted`."""
    requests = json.dumps(gathering.encoded(wanted), sort_keys=True)
    command = gathering.HostState().command(requests).removesuffix(" || true")
    out = subprocess.run(["sh", "-c", command.replace("python3 -c", f"{sys.executable} -c", 1)], capture_output=True,
                         text=True, env=env, check=True, input=gathering.stdin_of([fact for fact, _ in wanted]))
    answers = json.loads(out.stdout)
    return {fact.__name__ + repr(sorted(kwargs.items())): fact().process(lines) if lines else fact.default()
            for (fact, kwargs), lines in zip(wanted, answers) if lines is not None}


def assert_same(wanted: list, env: dict) -> None:
    gathered = host_program(wanted, env)
    for fact, kwargs in wanted:
        key = fact.__name__ + repr(sorted(kwargs.items()))
        assert key in gathered, f"{key} left to its own command"
        assert gathered[key] == own_command(fact, env, **kwargs), key


@pytest.mark.parametrize("profile", ["b200_nvlink", "rtx_pro_6000_pcie"])
def test_gpu_facts_as_their_own_commands_on_the_gpu_stand_in(tmp_path, profile):
    env = {**os.environ, **gpu_standin_env(tmp_path, profile)}
    assert_same([(NvidiaGpus, {}), (NvidiaTopology, {}), (NvidiaDriver, {}), (RebootPending, {}),
                 (NvidiaFabric, {})], env)


def test_a_driver_library_mismatch_reads_as_a_pending_reboot(tmp_path):
    env = {**os.environ, **gpu_standin_env(tmp_path, "b200_nvlink")}
    (tmp_path / "nvml-version").write_text("590.44.01 13.1\n")
    env["SPECFLEET_NVML_VERSION_FILE"] = str(tmp_path / "nvml-version")
    assert own_command(RebootPending, env) == ["Failed to initialize NVML: Driver/library version mismatch"]
    assert_same([(RebootPending, {}), (NvidiaGpus, {})], env)


@pytest.mark.parametrize("capture", ["h200-x1", "h200-x2-capture"])
def test_driver_and_fabric_from_one_full_q_read_as_on_the_real_host(capture):
    """One `nvidia-smi -q` stands for NvidiaDriver's and NvidiaFabric's filtered -q: the facts a real H200
    host gave through their own commands (facts.txt, then NvidiaDriver's `-q -d COMPUTE`) come out of its full -q,
    with each GPU's minor number, which NvidiaDriver's facts.txt predates."""
    host_programs_importable()
    import gpu_state
    folder = CAPTURES / capture
    facts = dict(re.findall(r"--> Fact data for: operations\.gpu\.facts\.(\w+)\n(\{.*?\n\})\n", (folder / "facts.txt").read_text(), re.S))
    real = {name: json.loads(text)["@local"] for name, text in facts.items()}
    q = (folder / "q.txt").read_text().splitlines()
    proc = (folder / "proc_driver_nvidia_version.txt").read_text().splitlines()
    driver = NvidiaDriver().process(proc + q)
    assert driver.pop("gpu_minor_numbers") == list(range(len(real["NvidiaFabric"]["gpus"])))
    assert driver == real["NvidiaDriver"]
    fabric = NvidiaFabric().process(gpu_state.nvidia_fabric("/nonexistent", {}, [], q))
    assert fabric["gpus"] == real["NvidiaFabric"]["gpus"]


def test_files_user_login_and_system_as_their_own_commands(tmp_path):
    (tmp_path / "file").write_text("content\n")
    (tmp_path / "file").chmod(0o640)
    (tmp_path / "dir").mkdir(mode=0o750)
    (tmp_path / "link").symlink_to(tmp_path / "file")  # [ -f ] follows it, stat does not
    (tmp_path / "sticky").mkdir()
    (tmp_path / "sticky").chmod(0o1777)
    paths = tuple(str(tmp_path / name) for name in ("file", "dir", "link", "sticky", "missing"))
    record = tmp_path / "gpu-smoke.json"
    record.write_text(json.dumps({"verdict": "passed", "boot_id": "x"}) + "\n")
    env = dict(os.environ)
    assert_same([(FileStates, dict(paths=paths)), (SystemUser, dict(user="root")),
                 (SystemUser, dict(user="specfleet-no-such-user")), (LoginUser, {}), (Arch, {}),
                 (LinuxDistribution, {}), (GpuSmokeRecord, dict(path=str(record))),
                 (GpuSmokeRecord, dict(path=str(tmp_path / "absent.json"))),
                 (UserFileStates, dict(user="specfleet-no-such-user", paths=paths))], env)
    if os.geteuid() == 0:  # read as another user: a forked child that became it, as runuser does
        assert_same([(UserFileStates, dict(user="nobody", paths=("/etc/passwd", "/root", str(tmp_path))))], env)
        assert_same([(FileStates, dict(paths=paths)),
                     (UserFileStates, dict(user="nobody", paths=("/etc/passwd",)))], env)  # one stdin, two readers


def test_a_files_digest_is_keyed_by_the_run_never_a_plain_hash_a_log_could_be_checked_against(tmp_path):
    """-vvv prints these states: the token's and the keys' among them (operations/basics/file_states.py)."""
    (tmp_path / "token").write_text("hf_secret")
    [state] = own_command(FileStates, dict(os.environ), paths=(str(tmp_path / "token"),)).values()
    assert state["digest"] == digest_of(b"hf_secret")
    assert state["digest"] not in (hashlib.sha1(b"hf_secret").hexdigest(), hashlib.sha256(b"hf_secret").hexdigest())
    assert DIGEST_KEY not in FileStates().command(paths=(str(tmp_path / "token"),))
    # The key reaches the host program on stdin where file states are gathered, and no other value does.
    assert gathering.stdin_of([SystemUser, FileStates, UserFileStates]) == DIGEST_KEY
    assert gathering.stdin_of([SystemUser, LoginUser]) is None


def test_venv_versions_from_dist_info_as_the_venvs_own_python_reads_them(tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = next(venv.glob("lib/python*/site-packages"))
    (site / "Some_Dist-1.2.3+lab.dist-info").mkdir()
    (site / "Some_Dist-1.2.3+lab.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: some-dist\nVersion: 1.2.3+lab\n\nbody\n")
    (venv / MARKER).write_text("3f2a9c0d1e4b5a6c\n")
    env = dict(os.environ)
    assert_same([(VenvRequirement, dict(path=str(venv), distribution="some-dist")),
                 (VenvRequirement, dict(path=str(venv), distribution="absent")),
                 (VenvRequirement, dict(path=str(tmp_path / "no-venv"), distribution="some-dist"))], env)
    assert own_command(VenvRequirement, env, path=str(venv), distribution="some-dist") == \
        {"version": "1.2.3+lab", "fingerprint": "3f2a9c0d1e4b5a6c"}
    show = "import importlib.metadata as m; print(m.version('some-dist'))"
    assert subprocess.run([venv / "bin" / "python", "-c", show], capture_output=True, text=True,
                          check=True).stdout.strip() == "1.2.3+lab"  # what the venv's own Python reads
    # A bin/python whose interpreter's name carries no version: the venv's one site-packages, still unstarted.
    (venv / "bin" / "python").unlink()
    (venv / "bin" / "python").symlink_to("/bin/true")
    assert own_command(VenvRequirement, env, path=str(venv), distribution="some-dist")["version"] == "1.2.3+lab"


def test_the_venvs_a_unit_file_starts_as_their_own_command_reads_them(tmp_path):
    """A build's virtualenv is used while a unit file, or the previous one kept for its rollback, starts its
    Python; `sglang-venv` is not used by a unit naming `sglang-venv-a` (the path is matched whole)."""
    for name in ("sglang-venv", "sglang-venv-a", "sglang-venv-b", "sglang-venv-c"):
        (tmp_path / name / "bin").mkdir(parents=True)
    (tmp_path / "sglang-venv-link").symlink_to(tmp_path / "sglang-venv-c")  # a link is no venv of its own
    units = tmp_path / "units"
    units.mkdir()
    (units / "sglang@x-gpu0.service").write_text(f"ExecStart={tmp_path}/sglang-venv-a/bin/python /opt/launch.py\n")
    (units / "sglang@x-gpu0.service.specfleet-previous").write_text(
        f"ExecStart={tmp_path}/sglang-venv-b/bin/python /opt/launch.py\n")
    (units / "other.service").write_text(f"ExecStart={tmp_path}/sglang-venv-c/bin/python /opt/launch.py\n")
    kwargs = dict(directory=str(tmp_path), stem="sglang-venv", units=(f"{units}/sglang*.service*",))
    assert_same([(VenvsUsed, kwargs)], dict(os.environ))
    assert own_command(VenvsUsed, dict(os.environ), **kwargs) == {
        f"{tmp_path}/sglang-venv": False, f"{tmp_path}/sglang-venv-a": True, f"{tmp_path}/sglang-venv-b": True,
        f"{tmp_path}/sglang-venv-c": False}


@pytest.mark.skipif(not Path("/run/systemd/system").is_dir(), reason="needs systemd as init")
def test_units_and_the_probe_as_their_own_commands(tmp_path):
    unit = tmp_path / "x.service"
    unit.write_text("[Service]\n")
    env = dict(os.environ)
    assert_same([(ServiceState, dict(unit_file=str(unit), env_file=str(tmp_path / "absent"),
                                     service="specfleet-no-such-unit")),
                 (ServiceState, dict(unit_file=str(unit), env_file=str(unit), service="systemd-journald")),
                 (ServiceState, dict(unit_file=str(unit), env_file=str(unit), service="dbus.socket"))], env)


def test_a_probe_of_a_closed_port_answers_as_the_probe_script(tmp_path):
    probe = dict(install_dir=str(tmp_path), port=9, model="m", key_file=str(tmp_path / "key"),
                 service_user="root")
    env = dict(os.environ)
    (tmp_path / "bin").mkdir()
    for name in ("probe_server", "owned_sockets", "engine_answers"):  # as uploaded: side by side in bin/
        (tmp_path / "bin" / f"{name}.py").write_bytes(HOST_SCRIPTS[name].read_bytes())
    assert_same([(ServerProbe, probe)], env)


def counting(directory: Path, program: str, env: dict) -> Path:
    """PROGRAM as the host program finds it on PATH, logging each run (one line of its arguments) before it
    runs the one found before (none: exit 1); the log's path."""
    import shutil
    real = shutil.which(program, path=env["PATH"])
    log = directory / f"{program}.log"
    (directory / "counted").mkdir(exist_ok=True)
    wrapper = directory / "counted" / program
    wrapper.write_text(f'#!/bin/sh\necho "$*" >> {log}\n' + (f'exec {real} "$@"\n' if real else "exit 1\n"))
    wrapper.chmod(0o755)
    env["PATH"] = f"{wrapper.parent}:{env['PATH']}"
    return log


def test_one_host_program_run_asks_nvidia_smi_once_per_kind_and_systemd_once_for_every_unit(tmp_path):
    """The GPU facts of every deployment (each asks them, with the same arguments) read one run of each
    nvidia-smi output; the ServiceState of every replica and the fabric's units one `systemctl show`: on a
    real H200 host a no-op's program takes 0.24 s, and each nvidia-smi or systemctl start on a lab host
    tens of milliseconds more."""
    env = {**os.environ, **gpu_standin_env(tmp_path, "b200_nvlink")}
    smi_log, systemctl_log = counting(tmp_path, "nvidia-smi", env), counting(tmp_path, "systemctl", env)
    gpu = [(NvidiaGpus, {}), (NvidiaTopology, {}), (NvidiaDriver, {}), (RebootPending, {}), (NvidiaFabric, {})]
    replicas = [(ServiceState, dict(unit_file=str(tmp_path / f"sglang@q-gpu{i}.service"),
                                    env_file=str(tmp_path / f"q-gpu{i}.env"), service=f"sglang@q-gpu{i}"))
                for i in range(3)]
    requests = json.dumps([*gathering.encoded(gpu * 2 + replicas)], sort_keys=True)
    command = gathering.HostState().command(requests).removesuffix(" || true")
    subprocess.run(["sh", "-c", command.replace("python3 -c", f"{sys.executable} -c", 1)], capture_output=True,
                   text=True, env=env, check=True, input=DIGEST_KEY)
    runs = sorted(smi_log.read_text().splitlines())
    assert runs == sorted(["--query-gpu=index,name,memory.total,compute_cap,driver_version,persistence_mode,"
                           "mig.mode.current --format=csv,noheader,nounits", "topo -m", "-q"])
    shown = systemctl_log.read_text().splitlines()
    assert len(shown) == 1, shown
    assert all(f"{unit}.service" in shown[0].split()
               for unit in ("nvidia-fabricmanager", "nvidia-persistenced", *(f"sglang@q-gpu{i}" for i in range(3))))


def test_a_no_op_host_program_imports_no_module_its_answers_leave_unused(tmp_path):
    """A probe of a loopback port and a current python3's HostPython import neither the idna codec (a str
    host to getaddrinfo) nor urllib.request: together 23 ms of a lab host's program, which runs on every
    no-op, and the probe is its longest part."""
    from operations.python.virtualenvs import HostPython
    probe = dict(install_dir=str(tmp_path), port=9, model="m", key_file=str(tmp_path / "key"), service_user="root")
    requests = json.dumps(gathering.encoded([(ServerProbe, probe), (HostPython, dict(uv=str(tmp_path / "uv")))]),
                          sort_keys=True)
    command = gathering.HostState().command(requests).removesuffix(" || true")
    out = subprocess.run(["sh", "-c", command.replace("python3 -c", f"{sys.executable} -X importtime -c", 1)],
                         capture_output=True, text=True, check=True, input=DIGEST_KEY)
    imported = {line.rsplit("|", 1)[-1].strip() for line in out.stderr.splitlines() if line.startswith("import time:")}
    assert json.loads(out.stdout)[0] and "http.client" in imported  # the probe ran, over HTTP
    assert not imported & {"encodings.idna", "urllib.request"}, sorted(imported & {"encodings.idna", "urllib.request"})
