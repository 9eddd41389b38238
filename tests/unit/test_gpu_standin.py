"""The lab's nvidia-smi STAND-IN, run on the controller: its answers go through the real
facts' commands and process(), the classify CLI and the class check, and must agree with
the real captures each profile was built from."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from operations.gpu.checks import check_fabric, check_gpu_class
from operations.gpu.classify import classify_dir
from operations.gpu.facts import NvidiaDriver, NvidiaFabric, NvidiaGpus, NvidiaHost, NvidiaTopology, RebootPending
from operations.gpu.parse import parse_topology
from tests.unit.group_data import class_expectations

REPO = Path(__file__).resolve().parents[2]
STANDIN = REPO / "lab" / "gpu_standin" / "nvidia-smi"
PROFILES = REPO / "lab" / "gpu_standin" / "profiles"
ALL_PROFILES = sorted(path.name for path in PROFILES.iterdir())


@pytest.fixture
def lab_host(tmp_path):
    """A controller-side lab host: nvidia-smi on PATH, its profile file, /proc/driver swapped."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").symlink_to(STANDIN)
    profile_file = tmp_path / "gpu-profile"
    env = dict(
        os.environ,
        PATH=f"{bin_dir}:/usr/bin:/bin",
        SPECFLEET_GPU_PROFILE_FILE=str(profile_file),
        SPECFLEET_GPU_PROFILES_DIR=str(PROFILES),
    )

    class LabHost:
        def use(self, profile):
            profile_file.write_text(profile + "\n")
            self.profile = profile

        def smi(self, *args):
            return subprocess.run([str(STANDIN), *args], env=env, capture_output=True, text=True)

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

    return LabHost()


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
    "b300_nvlink": "b300_nvlink",
    "rtx_pro_6000_pcie": "rtx_pro_6000_pcie",
    "rtx_pro_6000_pcie_old_driver": "rtx_pro_6000_pcie",
}
EXPECTED_PROBLEM = {
    "b200_nvlink_7gpu": "found 7",
    "b200_nvlink_degraded": "found a degraded board: GPU 3 reach",
    "rtx_pro_6000_pcie_old_driver": "found 570.124.06 (CUDA 12.8)",
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
    fabric = lab_host.fact(NvidiaFabric)
    assert fabric["nvswitch"] is expected.fabric_manager
    assert {gpu["fabric_state"] for gpu in fabric["gpus"]} == ({"Completed"} if expected.fabric_manager else {None})
    if expected.fabric_manager:
        # Only the unit state is left to the lab (the controller runs no fabric manager).
        units = dict(fabric["units"], **{"nvidia-fabricmanager": dict(enabled="enabled", active="active")})
        assert check_fabric("lab", class_name, expected, dict(fabric, units=units)) == []


def test_gpus_fact_fields(lab_host):
    lab_host.use("b300_nvlink")
    gpus = lab_host.fact(NvidiaGpus)
    assert len(gpus) == 8
    assert gpus[7] == dict(
        index=7, name="NVIDIA B300 SXM6 AC", memory_total_mib=275040, compute_capability="10.3",
        driver_version="580.95.05", persistence_mode="Enabled", mig_mode="Disabled",
    )


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


@pytest.mark.parametrize(
    "args", [["--bogus"], ["-q", "-d", "MEMORY"], ["--query-gpu=name"], ["--query-gpu=foo", "--format=csv"]]
)
def test_unknown_options_exit_2(lab_host, args):
    lab_host.use("b200_nvlink")
    result = lab_host.smi(*args)
    assert result.returncode == 2
    assert result.stdout.strip()


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
