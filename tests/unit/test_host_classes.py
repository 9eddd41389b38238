"""Host classes are found from their files (deployment/site_data.py host_classes): the product's
group_data/<class>.py and a site's own SITE/group_data/<class>.py, one file each; the shipped HGX Hopper
classes (h100_sxm, h200_sxm) checked against the real nvidia-smi captures in tests/fixtures/nvidia-smi."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from deployment import roles, site_data
from deployment.hosts import host_class_of, resolve_worker
from operations.gpu.checks import check_gpu_class
from operations.gpu.facts import NvidiaDriver
from operations.gpu.parse import parse_topology
from tests.deployed.hosts import load_inventory
from tests.unit.group_data import class_expectations
from tools.gpu.classify import classify_dir, load_class_expectations
from tools.gpu.smi_captures import parse_query_csv

REPO = Path(__file__).resolve().parents[2]
CAPTURES = REPO / "tests" / "fixtures" / "nvidia-smi"
PYINFRA = Path(sys.executable).with_name("pyinfra")
# A class of a site's own: 8x H100 on PCIe, one file with the class's knobs alone.
SITE_CLASS = '''
expected_gpus = dict(name_patterns=[r"^NVIDIA H100 PCIe$"], count=8, min_memory_mib=81000, compute_capability="9.0",
                     interconnect="pcie", driver_min="580", open_kernel_module=False, fabric_manager=False,
                     allreduce_floor_gbps=5, p2p_floor_gbps=30)
layouts = dict(qwen36_ddtree=dict(tp_size=2))
sglang_tuning = dict(attention_backends=dict(mla=("fa3", "fa3"), mha=("fa3", "fa3")), mem_fraction_static=0.88,
                     extra_args=[], env=dict())
'''


@pytest.fixture
def site_dir(tmp_path, monkeypatch):
    directory = tmp_path / "site"
    (directory / "group_data").mkdir(parents=True)
    (directory / "group_data" / "h100_pcie.py").write_text(SITE_CLASS)
    monkeypatch.setenv("SPECFLEET_SITE", str(directory))
    return directory


def test_a_class_is_a_group_file_that_declares_expected_gpus(monkeypatch):
    monkeypatch.delenv("SPECFLEET_SITE", raising=False)
    assert site_data.host_classes() == ("b200_nvlink", "b300_nvlink", "h100_sxm", "h200_sxm", "rtx_pro_6000_pcie")
    assert {"all", "gateway"} <= {path.stem for path in (REPO / "group_data").glob("*.py")}
    assert roles.serves_model(["h200_sxm"]) and not roles.serves_model(["gateway", "all"])
    assert list(load_class_expectations()) == list(site_data.host_classes())


def test_a_site_adds_a_class_with_one_file(site_dir, tmp_path):
    """One file in the site directory: the inventory's group is a class, its hosts resolve with its knobs,
    over group_data/all.py and under the host's own data."""
    assert site_data.host_classes()[-1] == "h100_pcie" and "h100_pcie" in load_class_expectations()
    inventory = tmp_path / "fleet.py"
    inventory.write_text("h100_pcie = [('gpu-1', {'profile': 'qwen36_ddtree'}), "
                         "('gpu-2', {'profile': 'qwen36_ddtree', 'layouts': {'qwen36_ddtree': {'tp_size': 4}}})]\n")
    hosts = load_inventory(str(inventory), str(REPO))
    assert host_class_of(hosts["gpu-1"].groups) == "h100_pcie"
    worker, (qwen,) = resolve_worker(hosts["gpu-1"].data, "h100_pcie")
    assert (worker.gpu.expected.name_patterns, worker.gpu.expected.fabric_manager) == (("^NVIDIA H100 PCIe$",), False)
    assert [r.engine.tp_size for r in qwen.replicas] == [2] * 4 and qwen.engine.mem_fraction_static == 0.88
    assert qwen.engine.attention_backend == "fa3" and str(qwen.weights.target.local_dir).startswith("/srv/specfleet/models/")
    _, (own,) = resolve_worker(hosts["gpu-2"].data, "h100_pcie")  # a host's own layouts over its class's
    assert [r.engine.tp_size for r in own.replicas] == [4, 4]


def test_a_site_class_deploys_dry_against_a_host(site_dir, tmp_path):
    """`pyinfra INVENTORY deploy.py --dry` on a host of the site's class: preflight judges it by that class."""
    inventory = tmp_path / "fleet.py"
    inventory.write_text("h100_pcie = [('@local', {'profile': 'qwen36_ddtree'})]\n")
    result = subprocess.run([str(PYINFRA), str(inventory), "deploy.py", "--dry"], cwd=REPO, capture_output=True,
                            text=True, timeout=300)
    output = result.stdout + result.stderr
    assert "Traceback" not in output and "no class group" not in output, output[-3000:]
    assert "@local: expected 8 GPUs (class h100_pcie), found no nvidia-smi" in output, output[-3000:]


@pytest.mark.parametrize("code, said", [
    ("weights_dir = '/data'\n", "sets weights_dir, which a class of the site may not set (group_data/all.py's "
                                "value would win): set it in SITE/group_data/all.py or the inventory"),
    ("expected_gpus = dict()\n", "lacks sglang_tuning: compare it with group_data/h100_sxm.py"),
])
def test_a_site_class_file_that_is_no_class_is_refused_in_one_line(site_dir, code, said):
    path = site_dir / "group_data" / "h100_pcie.py"
    path.write_text(SITE_CLASS + code if "weights_dir" in code else code)
    with pytest.raises(SystemExit) as stopped:
        site_data.class_values("h100_pcie")
    assert str(stopped.value) == f"{path} {said}"


def test_a_site_file_of_no_group_and_no_class_is_still_refused(site_dir):
    (site_dir / "group_data" / "h100_pcie.py").write_text("layouts = {}\n")
    with pytest.raises(SystemExit, match="h100_pcie.py overrides no group of specfleet"):
        site_data.overrides(str(REPO / "group_data" / "all.py"), {})


# --- the shipped HGX Hopper classes against real captures ---------------------------------------------


def real_driver() -> dict:
    """The real H200 host's driver fact (its /proc/driver/nvidia/version and -q), at 8 GPUs."""
    folder = CAPTURES / "h200-x2"
    driver = NvidiaDriver().process([*(folder / "proc_driver_nvidia_version.txt").read_text().splitlines(),
                                     *(folder / "q.txt").read_text().splitlines()])
    return {**driver, "gpu_minor_numbers": list(range(8))}


def eight_of(rows: list[str], name: str | None = None, memory: str | None = None) -> str:
    """An 8-GPU --query-gpu CSV from a real capture's rows: its header, its first GPU's row for each index
    (name and memory replaced where a real host of another model gave them), bus ids of their own."""
    header, first = rows[0], rows[1].split(", ")
    out = [header]
    for index in range(8):
        cells = list(first)
        cells[0], cells[3] = str(index), f"00000000:{0x18 + 0x10 * index:02X}:00.0"
        cells[1] = name or cells[1]
        cells[5] = memory or cells[5]
        out.append(", ".join(cells))
    return "\n".join(out) + "\n"


def test_the_real_2x_h200_capture_is_an_h200_sxm_board_but_for_its_count():
    found = classify_dir(CAPTURES / "h200-x2")
    expected = class_expectations("h200_sxm")
    assert (found["gpu_name"], found["memory_total_mib"], found["compute_capability"], found["interconnect"]) == (
        "NVIDIA H200", 143771, expected.compute_capability, expected.interconnect)
    assert found["memory_total_mib"] >= expected.min_memory_mib and found["host_class"] == "unknown"
    gpus = parse_query_csv((CAPTURES / "h200-x2" / "query.csv").read_text().splitlines())
    topology = parse_topology((CAPTURES / "h200-x2" / "topo.txt").read_text().splitlines())
    assert check_gpu_class("h200-x2", "h200_sxm", expected, gpus, topology, real_driver()) == [
        "h200-x2: expected 8 GPUs matching ^NVIDIA H200$ (class h200_sxm), found 2 (2 matching; names: NVIDIA H200): "
        "check `nvidia-smi -L`; a missing GPU usually needs a reseat or an RMA, a wrong model means this host "
        "belongs to another class"]


@pytest.mark.parametrize("host_class, name, memory", [("h200_sxm", None, None),
                                                      ("h100_sxm", "NVIDIA H100 80GB HBM3", "81559 MiB")])
def test_an_8_gpu_hgx_output_built_from_real_rows_is_its_class(tmp_path, host_class, name, memory):
    """No full 8-GPU capture of either board is in the repository: the 8x output is the real H200 host's
    --query-gpu row for each GPU (the H100's name and memory from a real H100 host: notes sglang.md section 11)
    and the published 8x H100 topo -m's rows (NV18 everywhere)."""
    rows = (CAPTURES / "h200-x2" / "query.csv").read_text().splitlines()
    (tmp_path / "query.csv").write_text(eight_of(rows, name, memory))
    (tmp_path / "topo.txt").write_text((CAPTURES / "h100-8x-nvlink-topo-rows-only" / "topo.txt").read_text())
    found = classify_dir(tmp_path)
    assert (found["gpu_count"], found["interconnect"], found["degraded"], found["host_class"]) == (
        8, "nvlink", False, host_class)
    gpus = parse_query_csv((tmp_path / "query.csv").read_text().splitlines())
    topology = parse_topology((tmp_path / "topo.txt").read_text().splitlines())
    assert check_gpu_class("hgx", host_class, class_expectations(host_class), gpus, topology, real_driver()) == []
    other = "h100_sxm" if host_class == "h200_sxm" else "h200_sxm"
    assert "a wrong model means" in check_gpu_class("hgx", other, class_expectations(other), gpus, topology,
                                                    real_driver())[0]


def test_the_published_8x_h100_topology_reads_nvlink_without_a_name():
    found = classify_dir(CAPTURES / "h100-8x-nvlink-topo-rows-only")
    assert (found["gpu_count"], found["interconnect"], found["degraded"], found["host_class"]) == (
        8, "nvlink", False, "unknown")  # no name: no class, however the topology fits h100_sxm
    assert class_expectations("h100_sxm").interconnect == found["interconnect"]


def test_hopper_boards_need_fabric_manager_and_accept_either_kernel_module():
    rows = (CAPTURES / "h200-x2" / "query.csv").read_text().splitlines()
    gpus = parse_query_csv(eight_of(rows).splitlines())
    topology = parse_topology((CAPTURES / "h100-8x-nvlink-topo-rows-only" / "topo.txt").read_text().splitlines())
    proprietary = {**real_driver(), "open_kernel_module": False}
    expected = class_expectations("h200_sxm")
    assert (expected.fabric_manager, expected.open_kernel_module, expected.compute_capability) == (True, False, "9.0")
    assert check_gpu_class("hgx", "h200_sxm", expected, gpus, topology, proprietary) == []
    assert "found the proprietary one" in check_gpu_class(
        "hgx", "b200_nvlink", class_expectations("b200_nvlink"), gpus, topology, proprietary)[-1]


def test_kimi_k26_on_80_gb_cards_is_refused_in_one_line_by_its_kv_plan_and_fits_141_gb_cards():
    """Kimi K2.6's weights fit 8x H100 80GB at TP 8 (74.4 GB a GPU) with nothing left for a pool once what a TP-8
    rank holds before its load is counted: preflight's capacity plan refuses it in one line; 8x H200 holds about
    798,000 tokens."""
    from tests.unit.test_capacity import kv_check, snapshots
    (line,), _ = kv_check("h100_sxm", snapshots(595, 6), 81559)
    assert line.startswith("host-1: sglang@kimi_k26_dflash-gpu0-7: its KV cache holds 0 tokens (0.0 GiB a GPU")
    assert "fewer than one full context (262144 tokens, the min_kv_tokens default)" in line
    problems, said = kv_check("h200_sxm", snapshots(595, 6), 143771)
    assert problems == [] and said.startswith("KV cache 798,")


def test_the_classify_cli_lists_a_site_class(site_dir, tmp_path):
    (tmp_path / "query.csv").write_text(eight_of((CAPTURES / "h200-x2" / "query.csv").read_text().splitlines(),
                                                 "NVIDIA H100 PCIe", "81559 MiB"))
    (tmp_path / "topo.txt").write_text("\tGPU0\tGPU1\tCPU Affinity\nGPU0\t X \tPIX\t0-31\nGPU1\tPIX\t X \t0-31\n")
    result = subprocess.run([sys.executable, "-m", "tools.gpu", "classify", str(tmp_path)], cwd=REPO,
                            capture_output=True, text=True, check=True)
    assert json.loads(result.stdout)["host_class"] == "h100_pcie"
