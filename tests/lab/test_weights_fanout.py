"""The weights' fan-out (deployment/weights/fanout.py, sharing.py, peer.py) on three fresh PCIe lab hosts
deploying qwen36_ddtree in one run, beside the shared lab (booted fresh for this module, gone after it).

The shared lab keeps the fan-out off (lab/group_data/lab.py): these deploys turn it on. The hub's request
log says what it served of each repo in the run; the hosts' manifests say what each took from whom.
Then one more run with two faults at once: a host whose peer serves a corrupted shard (the hash catches
it, the file comes from the hub), and a host cut off from its peers (blackhole routes), which says so in
one line and takes its weights from the hub while the others go on without it.
"""

import json
import os
import re
import subprocess
import sys
import time
from collections import Counter

import pytest

import lab
from lab import fleet, hub
from lab.services import HUB_STATE
from tests.conftest import LAB_HOSTS
from tests.helpers import REPO, changed_operations, operations_started, run_deploy, serving

pytestmark = pytest.mark.lab

TARGET, DRAFTER = "lab/Qwen3.6-27B-tiny", "lab/Qwen3.6-27B-DFlash-tiny"  # lab/group_data/lab.py's mirrors
TARGET_DIR = "/srv/specfleet/models/Qwen--Qwen3.6-27B/486dd609013642a52d0bf93941f6c21d3fb7ee37"
TARGET_UNIT = "specfleet-weights-Qwen--Qwen3.6-27B"
PORT = 30900  # weights_fanout_port's default


def spec_with_three_more_pcie(spec: str) -> tuple[str, list[str]]:
    counts = Counter({kind: int(count) for kind, count in (part.split("=") for part in spec.split(",") if part)})
    names = [f"lab-pcie-{counts['pcie'] + i}" for i in (1, 2, 3)]
    counts["pcie"] += 3
    return ",".join(f"{kind}={count}" for kind, count in counts.items()), names


SPEC, NAMES = spec_with_three_more_pcie(LAB_HOSTS)
LIMITS = [arg for name in NAMES for arg in ("--limit", name)]
FANOUT = ("--data", "weights_fanout=true", *LIMITS)
QWEN = serving("qwen36_ddtree")


def repo_bytes(repo_id: str) -> int:
    manifest = json.loads((HUB_STATE.parent / "store/models" / repo_id / "manifest.json").read_text())
    return sum(f["size"] for f in manifest["files"])


def received(host) -> dict:
    return json.loads(fleet.ssh(host, f"cat {TARGET_DIR}/.specfleet-manifest.json"))["received"]


def timed_deploy(*args: str):
    """The deploy serving Qwen, its seconds, and the hub's log of it."""
    since = len(hub.read_request_log(HUB_STATE))
    start = time.monotonic()
    result = run_deploy(*args, group_data=QWEN)
    return result, time.monotonic() - start, hub.read_request_log(HUB_STATE)[since:]


def to_hosts(records: list[dict], hosts) -> dict[str, int]:
    """The bytes the hub served the hosts (not the controller's preflight, which reads each repo's config)."""
    return hub.bytes_served_by_repo([r for r in records if r["client"] in {h.address for h in hosts}])


def flip_shards(host) -> None:
    """Flip the middle byte of each of the host's target shards, in place (same size): its weights look whole."""
    fleet.ssh(host, f"cd {TARGET_DIR} && python3 -c 'import glob, os\nfor p in glob.glob(\"*.safetensors\"):\n"
                    "    f = open(p, \"r+b\"); f.seek(os.path.getsize(p) // 2); b = f.read(1); f.seek(-1, 1)\n"
                    "    f.write(bytes([b[0] ^ 0xFF])); f.close()'")


@pytest.fixture(scope="module")
def fanout_lab(lab_hosts):
    """The three fresh hosts and what each run of the module gave: [(deploy, seconds, hub bytes by repo)]."""
    for leftover in fleet.read_fleet():
        if leftover.name in NAMES:
            fleet.stop_host(leftover)  # fresh: never deployed
    hosts = {h.name: h for h in lab.up(SPEC, log=lambda line: None) if h.name in NAMES}
    hub.clear_faults(HUB_STATE)
    runs = {"first": timed_deploy(*FANOUT)}
    try:
        yield hosts, runs
    finally:
        lab.up(LAB_HOSTS, log=lambda line: None)


def test_three_fresh_hosts_take_each_byte_from_the_hub_about_once(fanout_lab):
    hosts, runs = fanout_lab
    deploy, seconds, records = runs["first"]
    served = hub.bytes_served_by_repo(records)
    assert deploy.returncode == 0, deploy.output[-4000:]
    started = operations_started(deploy.output)
    assert started.index("Weights peer server") < started.index("Weights peers reachable") \
        < started.index("Weights") < started.index("Weights peer server stopped")
    repos = {repo: repo_bytes(repo) for repo in (TARGET, DRAFTER)}
    print(f"\nfirst deploy of {len(NAMES)} fresh hosts, fan-out on: {seconds:.0f} s; the hub served "
          + ", ".join(f"{repo} {served.get(repo, 0):,} of {size:,} bytes" for repo, size in repos.items()))
    for repo, size in repos.items():
        assert served.get(repo, 0) <= 1.1 * size, (repo, served, size)
    counts = {name: received(host) for name, host in hosts.items()}
    print("received by host:", counts)
    assert sum(c["hub"] for c in counts.values()) <= 1.1 * repos[TARGET]
    assert all(c["hub"] + c["peers"] >= repos[TARGET] for c in counts.values())
    assert sum(c["peers"] for c in counts.values()) >= repos[TARGET]  # the others' copies came from peers
    # The run's table says it per host.
    table = deploy.output.split("--> Summary:")[1]
    assert all(re.search(rf"{name} .*\d+\.\d MB, \d+\.\d MB, [\d.]+ MB/s", table) for name in NAMES), table
    # No peer server is left: stopped and its unit gone, nginx's own never started.
    for host in hosts.values():
        assert fleet.ssh(host, "systemctl is-active specfleet-weights-peer nginx; "
                               "ls /etc/systemd/system/specfleet-weights-peer.service", check=False).split()[:2] \
            == ["inactive", "inactive"]
        assert "30900" not in fleet.ssh(host, "ss -Hltn")


def test_the_deployed_checks_pass_and_a_second_run_verifying_every_byte_changes_nothing(fanout_lab):
    hosts, runs = fanout_lab
    profiles = ",".join(f"{name}=qwen36_ddtree" for name in NAMES)
    checks = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/deployed",
                             "--inventory", "lab/inventory.py", *LIMITS],
                            cwd=REPO, capture_output=True, text=True, timeout=600,
                            env={**os.environ, "HF_TOKEN": "hf_lab_granted", "SPECFLEET_LAB_PROFILES": profiles})
    assert checks.returncode == 0 and " failed" not in checks.stdout, checks.stdout[-4000:]
    # verify_weights: every file of every host hashed against the hub's hashes; none fetched again.
    again, seconds, records = timed_deploy(*FANOUT, "--data", "verify_weights=true")
    print(f"\nsecond run, every byte verified: {seconds:.0f} s")
    assert again.returncode == 0 and changed_operations(again.output) == [], again.output[-3000:]
    assert "Weights peer server" not in operations_started(again.output)
    assert to_hosts(records, hosts.values()) == {}


def test_a_corrupt_peer_is_caught_and_a_host_cut_off_takes_its_weights_from_the_hub(fanout_lab):
    hosts, runs = fanout_lab
    serving, refetching, cut = (hosts[name] for name in NAMES)
    flip_shards(serving)  # lab-pcie-2 serves wrong bytes of every shard, which its own check does not see
    fleet.ssh(cut, " && ".join(f"ip route add blackhole {h.address}/32" for h in (serving, refetching)))
    for host in (refetching, cut):
        fleet.ssh(host, f"rm -rf {TARGET_DIR}")
    try:
        deploy, seconds, records = timed_deploy(*FANOUT)
    finally:
        flip_shards(serving)
        fleet.ssh(cut, " ; ".join(f"ip route del blackhole {h.address}/32" for h in (serving, refetching)),
                  check=False)
    print(f"\ntwo hosts fetching again, one peer corrupt, one host cut off: {seconds:.0f} s")
    assert deploy.returncode == 0, deploy.output[-4000:]
    line = (f"[{cut.name}] {cut.name} and {serving.name}, {refetching.name} do not reach each other on port {PORT} "
            f"(weights_fanout_port): {cut.name} takes its weights from the hub")
    assert deploy.output.count(f"do not reach each other on port {PORT}") == 1, deploy.output[-4000:]
    assert line in deploy.output, deploy.output[-4000:]
    assert received(cut)["peers"] == 0
    # The hub served the cut-off host its copy and the corrupt shards' refetch; the rest came from lab-pcie-2.
    print("the hub served the hosts:", to_hosts(records, hosts.values()), "received:",
          {h.name: received(h) for h in (refetching, cut)})
    journal = fleet.ssh(refetching, f"journalctl -u {TARGET_UNIT} -o cat --no-pager")
    assert re.search(rf"sha256 mismatch for \S+\.safetensors .* from {serving.name}\b.*: deleted, dropping "
                     rf"{serving.name}", journal), journal[-3000:]
    assert f"dropping peer {serving.name}" not in journal  # it answered: its bytes were wrong, not absent
    # What both fetched is the hub's, byte for byte.
    manifest = json.loads((HUB_STATE.parent / "store/models" / TARGET / "manifest.json").read_text())
    for host in (refetching, cut):
        sums = dict(reversed(line.split()) for line in fleet.ssh(host, f"cd {TARGET_DIR} && sha256sum *.safetensors")
                    .splitlines())
        assert sums == {f["path"]: f["sha256"] for f in manifest["files"] if f["path"].endswith(".safetensors")}
