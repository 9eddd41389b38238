"""The class check and the fabric check, fed facts parsed from the real captures."""

from pathlib import Path

from operations.gpu.checks import check_fabric, check_gpu_class
from operations.gpu.facts import NvidiaGpus
from operations.gpu.parse import parse_topology
from tools.gpu.smi_captures import parse_query_csv, parse_smi_table
from tests.unit.group_data import class_expectations as expectations

REPO = Path(__file__).resolve().parents[2]
CAPTURES = REPO / "tests" / "fixtures" / "nvidia-smi"


def b200_gpus(count=8, name="NVIDIA B200", driver="580.95.05"):
    return [
        dict(index=i, name=name, memory_total_mib=183359, compute_capability="10.0", driver_version=driver,
             persistence_mode="Enabled", mig_mode="Disabled")
        for i in range(count)
    ]


B200_TOPOLOGY = parse_topology((CAPTURES / "b200-8x-nvlink" / "topo.txt").read_text().splitlines())
OPEN_580 = dict(version="580.95.05", kernel_module_version="580.95.05", open_kernel_module=True, cuda_version="13.0")


def check_b200(**facts):
    facts = dict(dict(gpus=b200_gpus(), topology=B200_TOPOLOGY, driver=OPEN_580), **facts)
    return check_gpu_class("lab-b200-1", "b200_nvlink", expectations("b200_nvlink"), **facts)


def test_healthy_b200_has_no_problem():
    assert check_b200() == []


def test_missing_gpu_names_host_expectation_finding_and_fix():
    [problem] = check_b200(gpus=b200_gpus(count=7))
    assert problem.startswith("lab-b200-1: expected 8 GPUs matching ^NVIDIA B200$ (class b200_nvlink), found 7")
    assert "nvidia-smi -L" in problem and "reseat" in problem


def test_degraded_board_is_named_with_its_pcie_only_gpu():
    topology = parse_topology(
        ["\tGPU0\tGPU1\tGPU2", "GPU0\t X \tNV18\tSYS", "GPU1\tNV18\t X \tSYS", "GPU2\tSYS\tSYS\t X "]
    )
    [problem] = check_b200(topology=topology)
    assert "degraded" in problem and "GPU 2" in problem


def test_pcie_board_under_an_nvlink_class():
    rtx_topology = parse_topology((CAPTURES / "rtxpro6000se-8x-pcie" / "topo.txt").read_text().splitlines())
    [problem] = check_b200(topology=rtx_topology)
    assert "expected nvlink interconnect" in problem and "found pcie" in problem


def test_old_proprietary_driver():
    problems = check_b200(driver=dict(version="570.158.01", open_kernel_module=False, cuda_version="12.9"))
    assert len(problems) == 2
    assert "driver branch 580+" in problems[0] and "found 570.158.01 (CUDA 12.9)" in problems[0]
    assert "open NVIDIA kernel module" in problems[1]


def test_a_gpu_without_a_minor_number_is_refused_naming_it():
    """Each replica's unit allows its GPUs' device nodes by their minor numbers (operations/server/sandbox.py):
    a GPU nvidia-smi -q gives none for would be a unit that cannot open its GPU, restarted into a crash loop."""
    known = dict(OPEN_580, gpu_minor_numbers=list(range(8)))
    assert check_b200(driver=known) == []
    [problem] = check_b200(driver=dict(known, gpu_minor_numbers=[0, 1, None, 3, 4, 5, None, 7]))
    assert problem.startswith("lab-b200-1: expected a device minor number for every GPU (class b200_nvlink), "
                              "found none in `nvidia-smi -q` for GPU 2, 6")
    assert "Minor Number" in problem


def test_h200_capture_against_b200_class():
    gpus = parse_query_csv((CAPTURES / "h200-x2-nvlink" / "query.csv").read_text().splitlines())
    problems = check_b200(gpus=gpus)
    assert any("found 2 (0 matching; names: NVIDIA H200)" in problem for problem in problems)


def test_small_memory_and_wrong_compute_capability():
    gpus = b200_gpus()
    gpus[5].update(memory_total_mib=90000, compute_capability="10.3")
    problems = check_b200(gpus=gpus)
    assert any("GPU 5 with 90000 MiB" in problem for problem in problems)
    assert any("compute capability 10.0" in problem and "10.0, 10.3" in problem for problem in problems)


def test_no_nvidia_smi_and_driver_mismatch():
    [problem] = check_b200(gpus=None)
    assert "found no nvidia-smi" in problem
    mismatch = ["Failed to initialize NVML: Driver/library version mismatch"]
    [problem] = check_b200(gpus=[], reboot_pending=mismatch)
    assert "version mismatch" in problem and "reboot" in problem


def fact_lines(case, file_name, exit_code):
    """What NvidiaGpus' command prints on a host answering as the capture does: the output, then its exit code."""
    return (CAPTURES / case / file_name).read_text().splitlines() + [f"@@nvidia-smi exit {exit_code}"]


def test_a_failing_nvidia_smi_leaves_the_gpus_unknown_and_preflight_says_why_and_what_to_do():
    gpus = NvidiaGpus().process(fact_lines("nvml-driver-library-mismatch", "query.csv", 18))
    assert gpus["unknown"]["exit_code"] == 18  # unknown: not zero GPUs
    [problem] = check_b200(gpus=gpus, topology=parse_topology([]), driver=None)
    assert problem == (
        "lab-b200-1: expected 8 GPUs (class b200_nvlink), found nvidia-smi unable to read them (exit code 18: "
        "Failed to initialize NVML: Driver/library version mismatch; NVML library version: 535.161): the NVML "
        "library is another version than the loaded kernel module (a driver installed or upgraded without a "
        "reboot): reboot the host so the installed driver's module loads")
    gpus = NvidiaGpus().process(fact_lines("driver-not-loaded", "query.csv", 9))
    [problem] = check_b200(gpus=gpus, topology=parse_topology([]), driver=None)
    assert "(exit code 9: NVIDIA-SMI has failed because it couldn't communicate" in problem
    assert problem.endswith("no NVIDIA driver is loaded: load it (`modprobe nvidia`; `dmesg | grep -i nvrm` says why "
                            "it did not load) or install the driver (open kernel module) and reboot")


def test_the_exit_code_not_the_text_says_the_query_failed():
    # An exit code no text of the known ones goes with (15: a GPU fell off the bus) still leaves them unknown.
    gpus = NvidiaGpus().process(["Unable to determine the device handle for GPU0000:17:00.0: Unknown Error",
                                 "@@nvidia-smi exit 15"])
    assert gpus["unknown"]["cause"] == "a GPU fell off the bus or is not accessible"
    assert NvidiaGpus().process(["0, NVIDIA B200, 183359, 10.0, 580.95.05, Enabled, Disabled",
                                 "@@nvidia-smi exit 0"])[0]["name"] == "NVIDIA B200"


def test_two_gpu_models_are_refused_even_when_the_class_names_both():
    gpus = [dict(gpu, name="NVIDIA RTX PRO 6000 Blackwell Server Edition", memory_total_mib=97887,
                 compute_capability="12.0") for gpu in b200_gpus()]
    for gpu in gpus[6:]:
        gpu["name"] = "NVIDIA RTX PRO 6000 Blackwell Max-Q Workstation Edition"
    rtx_topology = parse_topology((CAPTURES / "rtxpro6000se-8x-pcie" / "topo.txt").read_text().splitlines())
    problems = check_gpu_class("ct200", "rtx_pro_6000_pcie", expectations("rtx_pro_6000_pcie"), gpus=gpus,
                               topology=rtx_topology, driver=dict(OPEN_580, version="595.58.03"))
    assert problems == [
        "ct200: expected one GPU model (class rtx_pro_6000_pcie), found 2: 6x NVIDIA RTX PRO 6000 Blackwell Server "
        "Edition, 2x NVIDIA RTX PRO 6000 Blackwell Max-Q Workstation Edition: tensor parallelism splits the model "
        "evenly and runs at the slowest card's pace, so a host serves with one model only: move the odd cards, or "
        "serve from the matching ones in another class"]


def test_a_mixed_capture_names_both_models():
    gpus = parse_query_csv((CAPTURES / "mixed-rtx5090-rtx3090ti" / "query.csv").read_text().splitlines())
    problems = check_b200(gpus=gpus)
    assert any("found 2: 1x NVIDIA GeForce RTX 5090, 1x NVIDIA GeForce RTX 3090 Ti" in problem for problem in problems)


def test_mig_enabled_is_refused_and_the_card_memory_is_read():
    gpus = b200_gpus()
    gpus[2]["mig_mode"] = "Enabled"
    problems = check_b200(gpus=gpus)
    assert problems == ["lab-b200-1: expected MIG disabled (class b200_nvlink), found it enabled on GPU 2: SGLang "
                        "would see MIG instances (each a slice of the card's memory), not the cards: `nvidia-smi -i "
                        "<index> -mig 0` on each, then reset the GPUs or reboot"]
    table = parse_smi_table((CAPTURES / "a100-80gb-x2-mig" / "smi.txt").read_text().splitlines())
    assert [(gpu["memory_total_mib"], gpu["mig_mode"]) for gpu in table["gpus"]] == [(81920, "Enabled")] * 2


def fabric(manager_active="active", manager_enabled="enabled", state="Completed", nvswitch=True, count=8):
    return dict(
        nvswitch=nvswitch,
        units={"nvidia-fabricmanager": dict(enabled=manager_enabled, active=manager_active)},
        packages={},
        ib_umad_loaded=True,
        gpus=[dict(pci_bus_id=f"00000000:{i:02X}:00.0", fabric_state=state, fabric_status="Success") for i in range(count)],
    )


def test_fabric_ready():
    assert check_fabric("lab-b200-1", "b200_nvlink", expectations("b200_nvlink"), fabric()) == []


def test_fabric_manager_down_and_gpus_not_registered():
    problems = check_fabric(
        "lab-b200-1", "b200_nvlink", expectations("b200_nvlink"), fabric(manager_active="failed", state="In Progress")
    )
    assert len(problems) == 2
    assert "nvidia-fabricmanager active" in problems[0] and "found it failed" in problems[0]
    assert "In Progress/Success" in problems[1] and "802" in problems[1]


def test_fabric_manager_must_not_run_on_the_pcie_class():
    expected = expectations("rtx_pro_6000_pcie")
    no_manager = fabric(manager_enabled=None, manager_active="inactive", state=None)
    assert check_fabric("lab-rtx-1", "rtx_pro_6000_pcie", expected, no_manager) == []
    [problem] = check_fabric("lab-rtx-1", "rtx_pro_6000_pcie", expected, fabric())
    assert "systemctl disable --now nvidia-fabricmanager" in problem


def test_an_old_driver_is_no_reason_to_stop_when_the_deploy_installs_the_driver():
    old = dict(version="570.158.01", kernel_module_version="570.158.01", open_kernel_module=False, cuda_version="12.9")
    assert len(check_b200(driver=old)) == 2  # branch too old, proprietary module
    assert check_b200(driver=old, install_driver=True) == []
