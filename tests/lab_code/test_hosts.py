"""The lab's hosts are real systems: systemd, sshd, own network namespace, GPU stand-in."""

import json

import pytest

from lab import fleet
from lab.config import BRIDGE, CONTROLLER_IP, HUB_PORT, HUB_URL, INDEX_URL, TOKEN_DENIED, TOKEN_GRANTED

pytestmark = pytest.mark.lab


def test_every_host_runs_systemd_and_answers_ssh(lab_hosts):
    for host in lab_hosts:
        assert fleet.ssh(host, "systemctl is-system-running", check=False).strip() in (
            "running", "degraded"), host.name
        assert fleet.ssh(host, "cat /proc/1/comm").strip() == "systemd", host.name
        assert fleet.ssh(host, "hostname").strip() == host.name


def test_each_host_has_its_own_network_namespace(lab_hosts):
    for host in lab_hosts:
        links = fleet.ssh(host, "ip -br addr")
        assert f"{host.address}/16" in links and "host0" in links, links
        assert BRIDGE not in links and "eth0 " not in links, f"{host.name} sees the controller's links"
        # ...and reaches the controller across its veth link (the hub listens on the bridge address).
        fleet.ssh(host, f"timeout 3 bash -c 'echo > /dev/tcp/{CONTROLLER_IP}/{HUB_PORT}'")


def test_gpu_standin_answers_as_the_pcie_profile(pcie_host):
    out = fleet.ssh(pcie_host, "nvidia-smi --query-gpu=name,memory.total --format=csv,noheader")
    assert out.splitlines() == ["NVIDIA RTX PRO 6000 Blackwell Server Edition, 97887 MiB"] * 8


def test_gpu_standin_serves_driver_proc_files(pcie_host, b200_host):
    assert "Open Kernel Module" in fleet.ssh(pcie_host, "cat /proc/driver/nvidia/version")
    assert fleet.ssh(b200_host, "ls /proc/driver/nvidia-nvswitch/devices").split()
    assert fleet.ssh(pcie_host, "ls /proc/driver/nvidia-nvswitch/devices 2>/dev/null; true") == ""


@pytest.fixture(scope="module")
def host_venv(pcie_host):
    """A venv on a lab host filled from the lab's package index, as a real host fills one from PyPI."""
    fleet.ssh(pcie_host, "test -x /opt/labcheck/bin/python || python3 -m venv /opt/labcheck")
    fleet.ssh(pcie_host, f"/opt/labcheck/bin/pip install -q --index-url {INDEX_URL} "
                         "huggingface_hub==2.4.0 sglang==0.5.23", timeout=300)
    return "/opt/labcheck/bin/python"


DOWNLOAD = """
import json, sys
from huggingface_hub import snapshot_download
from huggingface_hub.errors import GatedRepoError
try:
    path = snapshot_download(sys.argv[1], local_dir=sys.argv[2])
    print(json.dumps({"ok": path}))
except GatedRepoError as error:
    print(json.dumps({"gated": str(error).splitlines()[0]}))
"""


def _download(host, python, token, repo):
    env = f"HF_ENDPOINT={HUB_URL} HF_HUB_DISABLE_XET=1 HF_TOKEN={token} HF_HOME=/tmp/hfhome-{token}"
    out = fleet.ssh(host, f"rm -rf /tmp/dl && {env} {python} -c '{DOWNLOAD}' {repo} /tmp/dl", timeout=120)
    return json.loads(out.splitlines()[-1])


def test_host_downloads_from_lab_hub_and_gated_repo_refuses_denied_token(pcie_host, host_venv):
    assert "gated" in _download(pcie_host, host_venv, TOKEN_DENIED, "lab/Kimi-K2.6-DFlash-tiny")
    assert "ok" in _download(pcie_host, host_venv, TOKEN_GRANTED, "lab/Kimi-K2.6-DFlash-tiny")
    assert "ok" in _download(pcie_host, host_venv, TOKEN_GRANTED, "lab/Kimi-K2.6-tiny")
    config = json.loads(fleet.ssh(pcie_host, "cat /tmp/dl/config.json"))
    assert config["text_config"]["model_type"] == "kimi_k2"


def test_sglang_standin_from_lab_index_starts_and_generates(pcie_host, host_venv):
    version = fleet.ssh(pcie_host, f"{host_venv} -c 'import importlib.metadata as m; "
                                   "print(m.version(\"sglang\"))'").strip()
    assert version == "0.5.23+lab"
    _download(pcie_host, host_venv, TOKEN_GRANTED, "lab/Kimi-K2.6-DFlash-tiny")
    fleet.ssh(pcie_host, "rm -rf /tmp/draft && mv /tmp/dl /tmp/draft")
    _download(pcie_host, host_venv, TOKEN_GRANTED, "lab/Kimi-K2.6-tiny")
    fleet.ssh(pcie_host, "systemd-run --unit=labcheck-sglang --collect "
                         f"{host_venv} -m sglang.launch_server --model-path /tmp/dl --port 30999 "
                         "--speculative-algorithm DFLASH --speculative-draft-model-path /tmp/draft "
                         "--speculative-num-draft-tokens 8 --mem-fraction-static 0.9")  # as every profile sets it
    try:
        out = fleet.ssh(pcie_host, "for i in $(seq 60); do curl -sf localhost:30999/health_generate "
                                   "&& break; sleep 0.5; done; curl -sf localhost:30999/server_info")
        info = json.loads(out[out.index("{"):])
        assert info["speculative_algorithm"] == "DFLASH"
        assert info["internal_states"][0]["avg_spec_accept_length"] > 1.0
    finally:
        fleet.ssh(pcie_host, "systemctl stop labcheck-sglang", check=False)
