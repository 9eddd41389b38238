"""The lab's nvidia-smi STAND-IN, run on the controller: its answers go through the real
facts' commands and process(), the classify CLI and the class check, and must agree with
the real captures each profile was built from."""

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from operations.basics.host_programs import HOST_SCRIPTS
from operations.gpu.checks import check_fabric, check_gpu_class
from tools.gpu.classify import classify_dir
from operations.gpu.facts import NvidiaDriver, NvidiaFabric, NvidiaGpus, NvidiaHost, NvidiaTopology, RebootPending
from operations.gpu.parse import parse_topology
from tools.gpu.smi_captures import parse_smi_xml
from tests.unit.group_data import class_expectations

REPO = Path(__file__).resolve().parents[2]
STANDIN = REPO / "lab" / "gpu_standin" / "nvidia-smi"
PROFILES = REPO / "lab" / "gpu_standin" / "profiles"
ALL_PROFILES = sorted(path.name for path in PROFILES.iterdir())


DAEMON_STANDIN = REPO / "lab" / "host_files" / "usr" / "lib" / "specfleet-lab" / "driver-daemon-standin"
TORCH_STANDIN = REPO / "lab" / "torch_standin"  # on a lab host: in the SGLang venv (the SGLang stand-in's wheel)
GPU_SMOKE = HOST_SCRIPTS["gpu_smoke"]
# The host programs it imports, which the deploy uploads beside it (INSTALL_DIR/bin).
HOST_PROGRAM_DIRS = sorted({str(path.parent) for path in HOST_SCRIPTS.values()})
H200_CAPTURES = REPO / "tests" / "fixtures" / "nvidia-smi"


@pytest.fixture
def lab_host(tmp_path):
    """A controller-side lab host: nvidia-smi on PATH, its profile file, /proc/driver swapped,
    its own run directory for the daemon stand-ins (stopped again at the end)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").symlink_to(STANDIN)
    profile_file = tmp_path / "gpu-profile"
    run_dir = tmp_path / "run"
    env = dict(
        os.environ,
        PATH=f"{bin_dir}:/usr/bin:/bin",
        SPECFLEET_GPU_PROFILE_FILE=str(profile_file),
        SPECFLEET_GPU_PROFILES_DIR=str(PROFILES),
        SPECFLEET_GPU_RUN_DIR=str(run_dir),
        SPECFLEET_NVML_VERSION_FILE=str(tmp_path / "nvml-version"),
    )

    class LabHost:
        library_file = tmp_path / "nvml-version"

        def use(self, profile):
            profile_file.write_text(profile + "\n")
            self.profile = profile
            env["SPECFLEET_PROC_DRIVER"] = str(PROFILES / profile / "proc-driver")

        def smi(self, *args):
            return subprocess.run([str(STANDIN), *args], env=env, capture_output=True, text=True)

        def start(self, daemon, **extra_env):
            """Start a daemon stand-in as its forking unit would; the CompletedProcess of its start."""
            return subprocess.run([str(DAEMON_STANDIN), daemon], env=dict(env, **extra_env), capture_output=True,
                                  text=True, timeout=30)

        def stop(self, daemon):
            os.kill(int((run_dir / f"{daemon}.pid").read_text()), signal.SIGTERM)
            time.sleep(0.1)

        def runtime_up(self):
            """What the deploy's GPU runtime steps start (nvidia.persistence_daemon, nvidia.fabric_manager)."""
            assert self.start("nvidia-persistenced").returncode == 0
            if json.loads((PROFILES / self.profile / "profile.json").read_text())["nvswitch"]:
                driver = lab_host_driver(self.profile)
                assert self.start("nvidia-fabricmanager", SPECFLEET_FABRICMANAGER_VERSION=driver).returncode == 0

        def smoke(self, floor_gbps, timeout=20, p2p_floor_gbps=None, p2p_timeout=None, previous=None, **nccl_env):
            """operations/gpu/host_scripts/gpu_smoke.py with the lab's torch (and its NCCL) importable, as
            in a lab host's SGLang venv: the record it prints."""
            p2p = ["--p2p-floor-gbps", str(p2p_floor_gbps), "--p2p-timeout", str(p2p_timeout or timeout)] \
                if p2p_floor_gbps else []
            done = subprocess.run([sys.executable, str(GPU_SMOKE), "--floor-gbps", str(floor_gbps), "--timeout",
                                   str(timeout), "--key", "k", *p2p, *(["--previous", str(previous)] if previous else [])],
                                  env=dict(env, PYTHONPATH=os.pathsep.join([str(TORCH_STANDIN), *HOST_PROGRAM_DIRS]), **nccl_env), capture_output=True,
                                  text=True, timeout=2 * timeout + 60)
            return json.loads(done.stdout.splitlines()[-1])

        def fact(self, fact_class):
            # The lab mounts the profile's proc-driver/ over /proc/driver; here the path is swapped.
            command = fact_class().command().replace("/proc/driver", str(PROFILES / self.profile / "proc-driver"))
            result = subprocess.run(["sh", "-c", command], env=env, capture_output=True, text=True)
            assert result.returncode == 0, result.stderr
            output = result.stdout.splitlines()
            # pyinfra gives the fact's default when the command prints nothing.
            return fact_class().process(output) if output else fact_class.default()

        def capture(self, directory):
            directory.mkdir()
            for file_name, args in {
                "topo.txt": ["topo", "-m"],
                "query.csv": ["--query-gpu=name,index,memory.total,driver_version,compute_cap", "--format=csv"],
                "q.txt": ["-q"],
                "q.xml": ["-q", "-x"],
                "smi.txt": [],
            }.items():
                result = self.smi(*args)
                assert result.returncode == 0, result.stdout
                (directory / file_name).write_text(result.stdout)
            return directory

    host = LabHost()
    host.env = env
    yield host
    for pid_file in run_dir.glob("*.pid") if run_dir.exists() else []:
        try:
            os.kill(int(pid_file.read_text()), signal.SIGKILL)
        except ProcessLookupError:
            pass


def lab_host_driver(profile):
    return json.loads((PROFILES / profile / "profile.json").read_text())["driver_version"]


CAPTURED_PROFILES = [
    name for name in ALL_PROFILES if "capture" in json.loads((PROFILES / name / "profile.json").read_text())
]


@pytest.mark.parametrize("profile", CAPTURED_PROFILES)
def test_classify_equals_the_real_capture(lab_host, tmp_path, profile):
    lab_host.use(profile)
    described = json.loads((PROFILES / profile / "profile.json").read_text())
    expected = classify_dir(REPO / described["capture"])
    # The documented departures from the capture (see "derived" in profile.json):
    expected.update(driver_version=described["driver_version"], compute_capability=described["gpus"][0]["compute_cap"])
    assert classify_dir(lab_host.capture(tmp_path / "capture")) == expected


@pytest.mark.parametrize("profile", ["b200_nvlink", "rtx_pro_6000_pcie"])
def test_topology_fact_equals_the_real_capture(lab_host, profile):
    lab_host.use(profile)
    capture = REPO / json.loads((PROFILES / profile / "profile.json").read_text())["capture"]
    assert lab_host.fact(NvidiaTopology) == parse_topology((capture / "topo.txt").read_text().splitlines())


CLASS_OF_PROFILE = {
    "b200_nvlink": "b200_nvlink",
    "b200_nvlink_7gpu": "b200_nvlink",
    "b200_nvlink_degraded": "b200_nvlink",
    "b200_nvlink_slow_allreduce": "b200_nvlink",
    "b300_nvlink": "b300_nvlink",
    "h100_sxm": "h100_sxm",
    "h200_sxm": "h200_sxm",
    "rtx_pro_6000_pcie": "rtx_pro_6000_pcie",
    "rtx_pro_6000_pcie_old_driver": "rtx_pro_6000_pcie",
    "rtx_pro_6000_pcie_p2p_hang": "rtx_pro_6000_pcie",
    "rtx_pro_6000_pcie_small_memory": "rtx_pro_6000_pcie",
}
EXPECTED_PROBLEM = {
    "b200_nvlink_7gpu": "found 7",
    "b200_nvlink_degraded": "found a degraded board: GPU 3 reach",
    "rtx_pro_6000_pcie_old_driver": "found 570.124.06 (CUDA 12.8)",
    "rtx_pro_6000_pcie_small_memory": "found GPU 0 with 1024 MiB",  # passed only with its min_memory_mib lowered
}
# What the GPU smoke test says on each profile once the GPU runtime is up (the reason's start).
# The host-memory path's 27.17 GB/s, as timed (measured()).
EXPECTED_SMOKE = {
    "b200_nvlink_degraded": r"bus bandwidth (2[1-7]|20\.[4-9])[.\d]* GB/s at 512 MiB is below the class's floor of 150 GB/s",
    "b200_nvlink_slow_allreduce": r"bus bandwidth (2[1-7]|20\.[4-9])[.\d]* GB/s at 512 MiB is below the class's floor of 150",
    "rtx_pro_6000_pcie_p2p_hang": r"the all-reduce did not finish within 5 s",
}


def test_every_profile_has_a_class():
    assert sorted(CLASS_OF_PROFILE) == ALL_PROFILES


@pytest.mark.parametrize("profile", ALL_PROFILES)
def test_facts_through_the_standin_pass_or_fail_the_class_check(lab_host, profile):
    lab_host.use(profile)
    class_name = CLASS_OF_PROFILE[profile]
    expected = class_expectations(class_name)
    driver = lab_host.fact(NvidiaDriver)
    assert driver["open_kernel_module"] is True
    assert driver["version"] == driver["kernel_module_version"]
    assert lab_host.fact(RebootPending) == []
    problems = check_gpu_class(
        f"lab-{profile}", class_name, expected,
        gpus=lab_host.fact(NvidiaGpus), topology=lab_host.fact(NvidiaTopology), driver=driver,
    )
    if profile in EXPECTED_PROBLEM:
        assert len(problems) == 1 and EXPECTED_PROBLEM[profile] in problems[0], problems
    else:
        assert problems == []


@pytest.mark.parametrize("profile", ALL_PROFILES)
def test_gpu_runtime_state_changes_only_when_its_daemons_run(lab_host, profile):
    lab_host.use(profile)
    expected = class_expectations(CLASS_OF_PROFILE[profile])
    before = lab_host.fact(NvidiaFabric)
    assert before["nvswitch"] is expected.fabric_manager
    assert {gpu["persistence_mode"] for gpu in lab_host.fact(NvidiaGpus)} == {"Disabled"}
    assert {(gpu["fabric_state"], gpu["fabric_status"]) for gpu in before["gpus"]} == (
        {("In Progress", None)} if expected.fabric_manager else {(None, None)})
    lab_host.runtime_up()
    after = lab_host.fact(NvidiaFabric)
    assert {gpu["persistence_mode"] for gpu in lab_host.fact(NvidiaGpus)} == {"Enabled"}
    assert {gpu["fabric_state"] for gpu in after["gpus"]} == ({"Completed"} if expected.fabric_manager else {None})
    if expected.fabric_manager:
        # Only the unit state is left to the lab (the controller runs no systemd units).
        units = dict(after["units"], **{"nvidia-fabricmanager": dict(enabled="enabled", active="active")})
        assert check_fabric("lab", CLASS_OF_PROFILE[profile], expected, dict(after, units=units)) == []
        assert "found 0000" in " ".join(check_fabric("lab", CLASS_OF_PROFILE[profile], expected, dict(before, units=units)))
    lab_host.stop("nvidia-persistenced")
    assert {gpu["persistence_mode"] for gpu in lab_host.fact(NvidiaGpus)} == {"Disabled"}


def test_fabric_manager_refuses_another_driver_version_like_the_real_one(lab_host):
    lab_host.use("b200_nvlink")
    started = lab_host.start("nvidia-fabricmanager", SPECFLEET_FABRICMANAGER_VERSION="580.82.07")
    assert started.returncode == 1
    # The real daemon's words (NVIDIA/gpu-operator#544, NVIDIA/gpu-driver-container#735).
    assert started.stderr == ("fabric manager NVIDIA GPU driver interface version 580.82.07 don't match with driver "
                              "version 580.95.05. Please update with matching NVIDIA driver package.\n")
    assert {gpu["fabric_state"] for gpu in lab_host.fact(NvidiaFabric)["gpus"]} == {"In Progress"}


def test_driver_library_mismatch_shows_like_the_real_tool(lab_host):
    lab_host.use("b200_nvlink")
    lab_host.library_file.write_text("595.58.03 13.2\n")  # packages upgraded, the 580 module still loaded
    for args in [["-L"], ["--query-gpu=name", "--format=csv"], ["-q"], ["topo", "-m"]]:
        result = lab_host.smi(*args)
        # The real tool's words and exit code (anderskm/gputil#55, mozilla/translations#1167).
        assert (result.returncode, result.stdout) == (
            18, "Failed to initialize NVML: Driver/library version mismatch\nNVML library version: 595.58\n")
    assert lab_host.fact(RebootPending) == ["Failed to initialize NVML: Driver/library version mismatch"]
    assert lab_host.fact(NvidiaGpus)["unknown"]["exit_code"] == 18  # unknown, not zero GPUs
    lab_host.library_file.write_text("580.95.05 13.0\n")  # after the reboot the installed module is loaded
    assert lab_host.smi("-L").returncode == 0


def test_gpus_fact_fields(lab_host):
    lab_host.use("b300_nvlink")
    lab_host.runtime_up()
    gpus = lab_host.fact(NvidiaGpus)
    assert len(gpus) == 8
    assert gpus[7] == dict(
        index=7, name="NVIDIA B300 SXM6 AC", memory_total_mib=275040, compute_capability="10.3",
        driver_version="580.95.05", persistence_mode="Enabled", mig_mode="Disabled",
    )


# The ring is GPU0..7 and back; on the PCIe board its hops are PIX, NODE (NCCL's PHB), PIX, SYS, PIX,
# NODE, PIX, SYS. Figures: the busbw at 512 MiB, or a hang.
NO_P2P, PCIE_P2P, NVLINK = 27.17, 41.3, 312.99


def measured(figure: float, slower: float = NO_P2P):
    """A bus bandwidth the stand-in's timed all-reduce reads for a profile figure: each collective takes the
    figure's time, plus the time to queue it, never less. Queueing is the host's CPU (every rank's message
    through rank 0), which on a loaded machine nears a fast link's 3 ms per 512 MiB collective (one make test
    read 210 GB/s for NVLink's 313): a fast path is told by being faster than the path it would be mistaken
    for (`slower`, the host-memory path's figure); a path no faster than that, by 3/4 of its own figure
    (27 GB/s is 35 ms a collective, where queueing does not show)."""
    lower = slower if slower < figure else 0.75 * figure
    return lambda busbw: lower < busbw <= figure


@pytest.mark.parametrize("profile", ALL_PROFILES)
def test_smoke_test_with_the_lab_torch(lab_host, profile):
    lab_host.use(profile)
    floor = class_expectations(CLASS_OF_PROFILE[profile]).allreduce_floor_gbps
    if json.loads((PROFILES / profile / "profile.json").read_text())["nvswitch"]:
        before = lab_host.smoke(floor)
        assert before["verdict"] == "failed" and "CUDA error: system not yet initialized" in before["reason"]
    lab_host.runtime_up()
    record = lab_host.smoke(floor, timeout=5 if profile in EXPECTED_SMOKE else 30)
    described = json.loads((PROFILES / profile / "profile.json").read_text())
    assert record["gpus"] == len(described["gpus"])
    if profile in EXPECTED_SMOKE:
        assert record["verdict"] == "failed" and re.match(EXPECTED_SMOKE[profile], record["reason"]), record
    else:
        # No NCCL setting: NCCL's default, P2P on every hop of these boards.
        p2p, no_p2p = (described["allreduce"][path]["busbw_gbps"]["536870912"] for path in ("p2p", "no_p2p"))
        assert record["verdict"] == "passed" and measured(p2p, no_p2p)(record["busbw_gbps"]), record.get("reason")
        assert (record["engine"], record["torch"], record["nccl"]) == ("torch.distributed+NCCL", "2.11.0+lab", "2.28.9")


P2P_CASES = [
    ("rtx_pro_6000_pcie", {}, PCIE_P2P),  # unset on an AMD host: P2P whenever it can
    ("rtx_pro_6000_pcie", {"NCCL_P2P_DISABLE": "1"}, NO_P2P),
    ("rtx_pro_6000_pcie", {"NCCL_P2P_DISABLE": "0"}, PCIE_P2P),
    ("rtx_pro_6000_pcie", {"NCCL_P2P_LEVEL": "SYS"}, PCIE_P2P),
    ("rtx_pro_6000_pcie", {"NCCL_P2P_LEVEL": "4"}, PCIE_P2P),  # the legacy number of SYS
    ("rtx_pro_6000_pcie", {"NCCL_P2P_LEVEL": "PHB"}, NO_P2P),  # the SYS hops go through host memory
    ("rtx_pro_6000_pcie", {"NCCL_P2P_LEVEL": "3"}, NO_P2P),  # PHB
    ("rtx_pro_6000_pcie", {"NCCL_P2P_LEVEL": "bogus"}, PCIE_P2P),  # unreadable: as if unset
    ("rtx_pro_6000_pcie", {"NCCL_P2P_DISABLE": "1", "NCCL_P2P_LEVEL": "SYS"}, NO_P2P),  # DISABLE wins
    ("rtx_pro_6000_pcie_p2p_hang", {}, "hang"),
    ("rtx_pro_6000_pcie_p2p_hang", {"NCCL_P2P_LEVEL": "PIX"}, "hang"),  # one P2P hop is enough
    ("rtx_pro_6000_pcie_p2p_hang", {"NCCL_P2P_LEVEL": "LOC"}, NO_P2P),
    ("rtx_pro_6000_pcie_p2p_hang", {"NCCL_P2P_DISABLE": "1"}, NO_P2P),
    ("b200_nvlink", {}, NVLINK),
    ("b200_nvlink", {"NCCL_P2P_LEVEL": "NVL"}, NVLINK),
    ("b200_nvlink", {"NCCL_P2P_DISABLE": "1"}, NO_P2P),  # NVLink unused: the host-memory path
]


@pytest.mark.parametrize("profile, nccl_env, outcome", P2P_CASES)
def test_the_lab_torch_takes_p2p_as_nccl_decides_it(lab_host, profile, nccl_env, outcome):
    lab_host.use(profile)
    lab_host.runtime_up()
    record = lab_host.smoke(5, timeout=4 if outcome == "hang" else 30, **nccl_env)
    if outcome == "hang":
        assert record["verdict"] == "failed" and record["reason"].startswith("the all-reduce did not finish within 4 s")
    else:
        assert record["verdict"] == "passed" and measured(outcome)(record["busbw_gbps"]), record


def test_nccl_debug_names_each_rings_transport_as_nccl_prints_it(lab_host):
    """What NCCL_DEBUG=INFO shows on real hosts: `Channel 00 : 1[1] -> 0[0] via SHM/direct/direct` with P2P
    disabled (local-inference-lab/rtx6kpro#15), `via P2P/...` when P2P carries the hop."""
    lab_host.use("rtx_pro_6000_pcie")
    lab_host.runtime_up()
    for nccl_env, via in (({}, "via P2P/CUMEM"), ({"NCCL_P2P_DISABLE": "1"}, "via SHM/direct/direct")):
        port = socket.create_server(("127.0.0.1", 0))
        address = port.getsockname()[1]
        port.close()
        script = ("import sys, torch, torch.distributed as dist; rank = int(sys.argv[1]); torch.cuda.set_device(rank); "
                  f"dist.init_process_group('nccl', init_method='tcp://127.0.0.1:{address}', rank=rank, world_size=2); "
                  "dist.barrier(); dist.destroy_process_group()")
        ranks = [subprocess.Popen([sys.executable, "-c", script, str(rank)], stderr=subprocess.PIPE, text=True,
                                  env=dict(lab_host.env, PYTHONPATH=str(TORCH_STANDIN), NCCL_DEBUG="INFO", **nccl_env))
                 for rank in (0, 1)]
        errors = [rank.communicate(timeout=30)[1] for rank in ranks]
        assert re.search(rf"NCCL INFO Channel 00/0 : 1\[1\] -> 0\[0\] {via}", errors[1]), errors
        assert "NCCL INFO comm rank 0 nRanks 2 - Init COMPLETE" in errors[0]


# P2P decided by the smoke test on the PCIe class's floors (group_data/rtx_pro_6000_pcie.py).
PCIE = class_expectations("rtx_pro_6000_pcie")


def test_a_pcie_host_whose_p2p_hangs_turns_it_off_and_keeps_it_off(lab_host, tmp_path):
    lab_host.use("rtx_pro_6000_pcie_p2p_hang")
    lab_host.runtime_up()
    record = lab_host.smoke(PCIE.allreduce_floor_gbps, timeout=30, p2p_floor_gbps=PCIE.p2p_floor_gbps, p2p_timeout=4)
    assert record["verdict"] == "passed" and measured(NO_P2P)(record["busbw_gbps"]), record
    p2p = record["p2p"]
    assert (p2p["enabled"], p2p["decided_by"], p2p["reason"]) == (False, "measurement",
                                                                  "the P2P all-reduce hung (no result within 4 s)")
    assert p2p["trial"]["reason"].startswith("the all-reduce did not finish within 4 s")
    previous = tmp_path / "previous.json"
    previous.write_text(json.dumps(record))
    again = lab_host.smoke(PCIE.allreduce_floor_gbps, timeout=30, p2p_floor_gbps=PCIE.p2p_floor_gbps, p2p_timeout=4,
                           previous=previous)
    assert again["p2p"]["decided_by"] == "an earlier measurement" and again["p2p"]["enabled"] is False
    assert again["seconds"] < 4  # not tried again: a hung P2P kernel can wedge the GPUs


def test_a_pcie_host_whose_p2p_works_keeps_it(lab_host):
    lab_host.use("rtx_pro_6000_pcie")
    lab_host.runtime_up()
    record = lab_host.smoke(PCIE.allreduce_floor_gbps, timeout=30, p2p_floor_gbps=PCIE.p2p_floor_gbps, p2p_timeout=10)
    assert record["verdict"] == "passed" and measured(PCIE_P2P)(record["busbw_gbps"]), record
    assert (record["p2p"]["enabled"], record["p2p"]["decided_by"]) == (True, "measurement")


def test_p2p_slower_than_its_floor_is_turned_off(lab_host):
    # The working PCIe board's P2P (~41 GB/s) against a floor above it: as slow as an IOMMU-routed path.
    lab_host.use("rtx_pro_6000_pcie")
    lab_host.runtime_up()
    record = lab_host.smoke(PCIE.allreduce_floor_gbps, timeout=30, p2p_floor_gbps=100, p2p_timeout=10)
    assert record["p2p"]["enabled"] is False and record["p2p"]["reason"].startswith("P2P bus bandwidth ")
    assert record["p2p"]["reason"].endswith("GB/s at 512 MiB is below the P2P floor of 100 GB/s")
    assert record["verdict"] == "passed" and measured(NO_P2P)(record["busbw_gbps"])


def test_profile_switches_without_restart(lab_host):
    lab_host.use("b200_nvlink")
    assert lab_host.fact(NvidiaTopology)["interconnect"] == "nvlink"
    lab_host.use("b200_nvlink_degraded")
    assert lab_host.fact(NvidiaTopology)["degraded"] is True


def test_query_units_and_header_like_the_real_tool(lab_host):
    lab_host.use("rtx_pro_6000_pcie")
    with_units = lab_host.smi("--query-gpu=index,memory.total", "--format=csv").stdout.splitlines()
    assert with_units[:2] == ["index, memory.total [MiB]", "0, 97887 MiB"]
    bare = lab_host.smi("--query-gpu=memory.total,name", "--format=csv,noheader,nounits").stdout.splitlines()
    assert bare[0] == "97887, NVIDIA RTX PRO 6000 Blackwell Server Edition"
    assert lab_host.smi("-L").stdout.startswith("GPU 0: NVIDIA RTX PRO 6000 Blackwell Server Edition (UUID: GPU-0")
    assert "NVIDIA RTX PRO 6000 Blac..." in lab_host.smi().stdout


def real_probes():
    """{nvidia-smi arguments: (stdout, exit code)} as a real H200 host answered them."""
    text = (H200_CAPTURES / "h200-x2-smoke" / "probes.txt").read_text()
    found = re.findall(r"(?ms)^### nvidia-smi (.*?)\n(.*?)^### rc=(\d+)\n", text)
    return {args: (output, int(code)) for args, output, code in found}


# Answered exactly (text and exit code) whatever the GPUs are.
EXACT_PROBES = ["--bogus", "--query-gpu=foo --format=csv", "--query-gpu=name --format=foo", "-q -d BOGUS"]


@pytest.mark.parametrize("args", EXACT_PROBES)
def test_errors_are_the_real_tools(lab_host, args):
    lab_host.use("b200_nvlink")
    result = lab_host.smi(*args.split())
    assert (result.stdout, result.returncode) == real_probes()[args]


def key_paths(q_text):
    """The (GPU-relative) key paths of -q text, values dropped: its shape."""
    paths, sections = set(), []
    for line in q_text.splitlines():
        if not line.strip() or line.startswith(("GPU ", "=")):
            continue
        indent = len(line) - len(line.lstrip())
        key = line.split(":")[0].strip()
        sections = [(i, k) for i, k in sections if i < indent]
        paths.add(tuple(k for _, k in sections) + (key,))
        sections.append((indent, key))
    return paths


@pytest.mark.parametrize("profile", ["b200_nvlink", "rtx_pro_6000_pcie"])
@pytest.mark.parametrize("args", ["-q -d MEMORY", "-q -d COMPUTE"])
def test_display_sections_are_shaped_like_the_real_tools(lab_host, profile, args):
    lab_host.use(profile)
    result = lab_host.smi(*args.split())
    real, code = real_probes()[args]
    assert result.returncode == code == 0
    assert key_paths(result.stdout) <= key_paths(real)
    assert "Total" in result.stdout if "MEMORY" in args else "Compute Mode" in result.stdout
    lines = result.stdout.splitlines()
    assert lines[:3] == real.splitlines()[:3] and lines[-1] == "" and lines[-2].startswith("    ")
    assert sum(line.startswith("GPU ") for line in lines) == 8


def test_query_without_format_answers_csv_like_the_real_tool(lab_host):
    lab_host.use("b200_nvlink")
    result = lab_host.smi("--query-gpu=name")
    assert (result.returncode, result.stdout) == (0, "name\n" + "NVIDIA B200\n" * 8)
    assert real_probes()["--query-gpu=name"] == ("name\nNVIDIA H200\nNVIDIA H200\n", 0)
    fabric = "--query-gpu=name,persistence_mode,fabric.state,fabric.status --format=csv"
    lab_host.runtime_up()
    assert lab_host.smi(*fabric.split()).stdout.splitlines()[:2] == real_probes()[fabric][0].replace(
        "NVIDIA H200", "NVIDIA B200").splitlines()[:2]


def xml_paths(node, prefix=""):
    path = f"{prefix}/{node.tag}"
    return {path}.union(*(xml_paths(child, path) for child in node))


@pytest.mark.parametrize("profile", ["b200_nvlink", "rtx_pro_6000_pcie"])
def test_q_xml_is_shaped_like_the_real_tools_and_says_the_hosts_state(lab_host, profile):
    lab_host.use(profile)
    real = (H200_CAPTURES / "h200-x2" / "q.xml").read_text()
    before = lab_host.smi("-q", "-x").stdout
    assert before.splitlines()[:3] == real.splitlines()[:3]  # XML declaration, DOCTYPE, root
    assert xml_paths(ET.fromstring(before)) <= xml_paths(ET.fromstring(real))
    lab_host.runtime_up()
    after = parse_smi_xml(lab_host.smi("-q", "-x").stdout)
    described = json.loads((PROFILES / profile / "profile.json").read_text())
    assert (after["driver_version"], after["cuda_version"]) == (described["driver_version"], described["cuda_version"])
    assert [(gpu["pci_bus_id"], gpu["name"], gpu["memory_total_mib"]) for gpu in after["gpus"]] == [
        (gpu["pci_bus_id"], gpu["name"], gpu["memory_total_mib"]) for gpu in described["gpus"]]
    fabric = ("Completed", "Success") if described["nvswitch"] else (None, None)
    assert {(gpu["persistence_mode"], gpu["fabric_state"], gpu["fabric_status"]) for gpu in after["gpus"]} == {
        ("Enabled", *fabric)}
    assert {gpu["persistence_mode"] for gpu in parse_smi_xml(before)["gpus"]} == {"Disabled"}


def test_profiles_are_built_without_the_projects_parsers():
    source = (REPO / "lab" / "gpu_standin" / "build_profiles.py").read_text()
    assert "operations" not in source.split('"""', 2)[2]  # the docstring may name them; the code never


def test_standin_says_what_it_is():
    head = STANDIN.read_text().splitlines()[:3]
    assert head[0] == "#!/usr/bin/python3"
    assert "STAND-IN" in head[1] and "NOT NVIDIA" in head[1]


def test_profiles_are_rebuilt_byte_for_byte(tmp_path):
    subprocess.run([sys.executable, str(REPO / "lab" / "gpu_standin" / "build_profiles.py"), str(tmp_path)], check=True)
    built = {path.relative_to(tmp_path): path.read_bytes() for path in tmp_path.rglob("*") if path.is_file()}
    committed = {path.relative_to(PROFILES): path.read_bytes() for path in PROFILES.rglob("*") if path.is_file()}
    assert built == committed


def test_standin_defaults_are_the_lab_paths():
    from lab.config import GPU_PROFILE_FILE, GPU_PROFILES_DIR

    source = STANDIN.read_text()
    assert f'"SPECFLEET_GPU_PROFILE_FILE", "{GPU_PROFILE_FILE}"' in source
    assert f'"SPECFLEET_GPU_PROFILES_DIR", "{GPU_PROFILES_DIR}"' in source


@pytest.mark.parametrize("profile", ["rtx_pro_6000_pcie", "b200_nvlink_degraded", "rtx_pro_6000_pcie_old_driver"])
def test_one_round_trip_host_fact_equals_the_four_facts(lab_host, profile):
    lab_host.use(profile)
    combined = lab_host.fact(NvidiaHost)
    for part in NvidiaHost.PARTS:
        assert combined[part.__name__] == lab_host.fact(part), part.__name__


def test_only_the_xml_answer_imports_an_xml_module(lab_host):
    """xml.sax.saxutils imports urllib.request (http.client, email, ssl): 30 ms of CPU on a lab host, which each
    of a no-op's three nvidia-smi runs (--query-gpu, topo -m, -q) would pay where the real tool pays none."""
    def imported(*args):
        run = subprocess.run([sys.executable, "-X", "importtime", str(STANDIN), *args], env=lab_host.env,
                             capture_output=True, text=True)
        assert run.returncode == 0, run.stdout
        return {line.rsplit("|", 1)[-1].strip() for line in run.stderr.splitlines() if line.startswith("import time:")}

    lab_host.use("b200_nvlink")
    for args in (["--query-gpu=index,name", "--format=csv"], ["topo", "-m"], ["-q"]):
        assert not {module for module in imported(*args) if module.startswith(("xml", "urllib"))}, args
    assert "xml.sax.saxutils" in imported("-q", "-x")
