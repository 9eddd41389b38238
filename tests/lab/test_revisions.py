"""Weights by revision and layouts that change under a serving host, on lab-pcie-1:

- a deploy of a new revision whose readiness fails leaves the host serving the previous revision from
  the previous revision's files, proven from the hashes of the files the running server loads;
- a host that ran the single-unit layout of earlier specfleet versions (one `sglang.service`, each
  repo's files in one directory) converges to the replicas and revision directories, its old bytes
  linked rather than fetched again, and a second run changes nothing;
- two models on one host, on disjoint GPUs, each verified by the deployed-host checks and benchmarked
  on its own.

Each test leaves the host as the shared lab has it (group_data's profile), but for the two last, which share one
deploy of Qwen (the `qwen_host` fixture) and put group_data's profile back after both.
"""

import json
import os
import re
import subprocess
import sys

import pytest

from lab import fleet
from lab.config import TOKEN_GRANTED
from lab.repos import QWEN, QWEN_RETRAINED
from lab.services import HUB_STATE, HUB_STORE
from lab.hub import read_request_log
from deployment.hosts import resolve, resolve_host
from tests.faults.faultlab import TARGET_DIR, http_status, wait_for
from tests.helpers import (REPO, SGLANG_UNIT, changed_operations, main_pid, operations_started, run_deploy, serving,
                           write_group_data)
from tests.lab.test_serving_benchmark import run_bench
from tests.unit.group_data import host_data

pytestmark = pytest.mark.lab

QWEN_GROUP_DATA = serving("qwen36_ddtree")
FIRST = "sglang@qwen36_ddtree-gpu0"  # the replica a deploy restarts first
KNOBS = "/etc/specfleet-lab/new-revision.json"  # the stand-in's faults for the new revision's units only


def hub_hashes(repo_id: str) -> dict[str, str]:
    """sha256 of each LFS file of a lab repo, as the lab hub lists it."""
    manifest = json.loads((HUB_STORE / "models" / repo_id / "manifest.json").read_text())
    return {f["path"]: f["sha256"] for f in manifest["files"] if f["lfs"]}


def loaded_hashes(host, unit: str) -> tuple[str, dict[str, str]]:
    """The weights directory the unit's running server loads (its process's --model-path) and the sha256
    of each safetensors file in it, read on the host."""
    launcher = main_pid(host, unit).split()[0]
    server = fleet.ssh(host, f"pgrep -P {launcher}").split()[0]
    argv = fleet.ssh(host, f"tr '\\0' '\\n' < /proc/{server}/cmdline").split("\n")
    model_dir = argv[argv.index("--model-path") + 1]
    sums = fleet.ssh(host, f"cd {model_dir} && sha256sum *.safetensors")
    return model_dir, {line.split()[1]: line.split()[0] for line in sums.splitlines()}


# The layout of earlier specfleet versions, laid down from the current deploy's own files: the one unit
# `sglang.service` (its environment file `sglang.env`, no CUDA_VISIBLE_DEVICES) loading each repo from one
# directory holding its files and manifest, and the per-role download units and specs. The files are
# moved up as root: cp -a by the download user, not in the service user's group, would leave them in its
# own group, which the service user cannot read.
EARLIER = r"""
set -e
cd /etc/systemd/system
systemctl disable --now {unit}
sed -e 's#{env}#/etc/specfleet/sglang.env#' -e 's#\(model-path [^ ]*\)/[0-9a-f]\{{40\}}#\1#g' {unit}.service > sglang.service
grep -v '^CUDA_' {env} > /etc/specfleet/sglang.env
rm -f {unit}.service {env}
for repo in {target} {drafter}; do
  dir=${{repo%/*}}
  find $dir -mindepth 1 -maxdepth 1 ! -path $repo -exec rm -rf {{}} + && cp -a $repo/. $dir/ && rm -rf $repo
done
for role in target drafter; do
  printf '[Service]\nType=oneshot\nExecStart=/bin/true\n' > specfleet-weights-$role.service
  echo '{{}}' > /etc/specfleet/weights-$role.json
done
systemctl daemon-reload
systemctl enable --now sglang
"""


def test_a_host_of_the_single_unit_layout_converges_and_its_old_weights_are_linked(deployed_lab, b200_host):
    host = b200_host
    d = resolve(host_data("b200_nvlink", lab=True), "b200_nvlink")
    fleet.ssh(host, EARLIER.format(unit=SGLANG_UNIT, env=d.replicas[0].env_file, target=d.weights.target.local_dir,
                                   drafter=d.weights.drafter.local_dir))
    wait_for(lambda: http_status(host, "/health") == 200, 60, 0.5, "the earlier layout's sglang.service to serve")
    assert fleet.ssh(host, f"ls {TARGET_DIR} 2>/dev/null || echo gone", check=False).strip() == "gone"
    mark = len(read_request_log(HUB_STATE))
    migrated = run_deploy("--limit", host.name)
    assert migrated.returncode == 0, migrated.output[-3000:]
    assert "retiring sglang (no deployment wants it any more)" in migrated.output
    assert fleet.ssh(host, "ls /etc/systemd/system/sglang.service /etc/specfleet/sglang.env "
                           "/etc/systemd/system/specfleet-weights-target.service /etc/specfleet/weights-target.json "
                           "2>/dev/null || true", check=False).strip() == ""
    assert fleet.ssh(host, "systemctl is-active sglang", check=False).strip() == "inactive"
    assert fleet.ssh(host, f"systemctl is-active {SGLANG_UNIT}").strip() == "active"
    # The revision directories were filled from the single directory's files: linked, none fetched.
    assert [r for r in read_request_log(HUB_STATE)[mark:] if r["client"] == host.address
            and "/resolve/" in r["path"]] == []
    shard = "model-00001-of-00004.safetensors"
    inodes = fleet.ssh(host, f"stat -c %i {TARGET_DIR}/{shard} {TARGET_DIR.rsplit('/', 1)[0]}/{shard}").split()
    assert inodes[0] == inodes[1]
    assert re.search(r"weights: kept the previous \S+ revision \w+ \(/srv/specfleet/models/moonshotai--Kimi-K2\.6\)",
                     migrated.output), migrated.output[-3000:]
    again = run_deploy("--limit", host.name)
    assert again.returncode == 0 and changed_operations(again.output) == []


TWO_MODELS = {"lab-pcie-1": [{"profile": "kimi_k26_dflash", "gpus": [0, 1, 2, 3], "tp_size": 4},
                             {"profile": "qwen36_ddtree", "gpus": [4, 5, 6, 7]}]}


def test_two_models_on_one_host_on_disjoint_gpus_each_verified_and_benchmarked_on_its_own(deployed_lab, pcie_host,
                                                                                          monkeypatch, tmp_path):
    host = pcie_host
    monkeypatch.setenv("SPECFLEET_LAB_DEPLOYMENTS", json.dumps(TWO_MODELS))
    try:
        both = run_deploy("--limit", host.name)
        assert both.returncode == 0, both.output[-3000:]
        wanted = ["sglang@kimi_k26_dflash-gpu0-3", *(f"sglang@qwen36_ddtree-gpu{i}" for i in range(4, 8))]
        units = fleet.ssh(host, "systemctl list-units --no-legend --plain --state=active 'sglang*'").split("\n")
        assert sorted(line.split()[0].removesuffix(".service") for line in units if line.strip()) == wanted
        # Each deployment runs as a user of its own (service_user-NAME), and neither writes the other's
        # ~/.cache, where Triton and torch put the .so files its servers load.
        users = {unit: fleet.ssh(host, f"systemctl show -p User --value {unit}").strip() for unit in wanted}
        assert users == {wanted[0]: "sglang-kimi_k26_dflash", **{unit: "sglang-qwen36_ddtree" for unit in wanted[1:]}}
        for mine, theirs in (("sglang-kimi_k26_dflash", "sglang-qwen36_ddtree"),
                             ("sglang-qwen36_ddtree", "sglang-kimi_k26_dflash")):
            touched = fleet.ssh(host, f"runuser -u {mine} -- touch /home/{theirs}/.cache/planted 2>/dev/null "
                                      "&& echo wrote || echo refused", check=False).strip()
            own = fleet.ssh(host, f"runuser -u {mine} -- touch /home/{mine}/.cache/planted && echo wrote "
                                  f"&& rm /home/{mine}/.cache/planted", check=False).strip()
            assert (touched, own) == ("refused", "wrote"), (mine, theirs, touched, own)
            # The key to the other's admin routes is not its to read; its own is.
            keys = [fleet.ssh(host, f"runuser -u {mine} -- cat /etc/specfleet/admin-api-key-{user.removeprefix('sglang-')} "
                                    ">/dev/null 2>&1 && echo read || echo refused", check=False).strip()
                    for user in (theirs, mine)]
            assert keys == ["refused", "read"], (mine, theirs, keys)
        # What stays open (docs/security.md): another deployment's code reaches a replica's TCPStore on loopback.
        store = fleet.ssh(host, f"grep -o -- '--nccl-port [0-9]*' /etc/systemd/system/{wanted[1]}.service").split()[1]
        reached = fleet.ssh(host, "runuser -u sglang-kimi_k26_dflash -- python3 -c 'import socket; "
                                  f"socket.create_connection((\"127.0.0.1\", {store}), 5); print(\"connected\")'",
                            check=False).strip()
        assert reached == "connected", reached
        # A virtualenv per build: the two deployments' builds differ (the release, the DDTree pull request).
        venvs = set(fleet.ssh(host, "ls -d /opt/specfleet/sglang-venv*").split())
        wanted = {d.engine.venv for d in resolve_host(host_data("rtx_pro_6000_pcie", lab=True,
                                                                deployments=TWO_MODELS[host.name]), "rtx_pro_6000_pcie")}
        assert len(wanted) == 2 and wanted <= venvs, venvs
        checks = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/deployed",
                                 "--inventory", "lab/inventory.py", "--limit", host.name, "-k", "not token"],
                                cwd=REPO, capture_output=True, text=True, timeout=600,
                                env={**os.environ, "HF_TOKEN": TOKEN_GRANTED})
        assert checks.returncode == 0 and " failed" not in checks.stdout, checks.stdout[-4000:]
        # Benchmarked on its own: one deployment after the other, each in its own results directory.
        bench = run_bench(host, "modes=ar", "concurrency=1", "requests=2", "output_tokens=8", "each_replica=false",
                          f"results_dir={tmp_path}")
        assert bench.returncode == 0, bench.output[-3000:]
        layouts = {path.parent.name: json.loads(path.read_text())["layout"]
                   for path in tmp_path.glob(f"*/{host.name}/*/summary.json")}
        assert layouts == {
            "kimi_k26_dflash": {"deployment": "kimi_k26_dflash", "tp_size": 4,
                                "replicas": {"sglang@kimi_k26_dflash-gpu0-3": [0, 1, 2, 3]}},
            "qwen36_ddtree": {"deployment": "qwen36_ddtree", "tp_size": 1,
                              "replicas": {f"sglang@qwen36_ddtree-gpu{i}": [i] for i in range(4, 8)}}}, layouts
        operations = operations_started(bench.output)
        assert operations.index("Benchmark sweep kimi_k26_dflash") < operations.index("Benchmark sweep qwen36_ddtree")
        again = run_deploy("--limit", host.name)
        assert again.returncode == 0 and changed_operations(again.output) == []
    finally:
        monkeypatch.delenv("SPECFLEET_LAB_DEPLOYMENTS")
        assert run_deploy("--limit", host.name).returncode == 0


@pytest.fixture(scope="module")
def qwen_host(deployed_lab, pcie_host):
    """lab-pcie-1 serving Qwen3.6-27B + DDTree (eight replicas), for the module's last tests, which each leave it
    serving Qwen from the revision a test may find already fetched; group_data's profile again afterwards."""
    first = run_deploy("--limit", pcie_host.name, group_data=QWEN_GROUP_DATA)
    assert first.returncode == 0, first.output[-3000:]
    yield pcie_host
    fleet.ssh(pcie_host, f"rm -f {KNOBS}")
    assert run_deploy("--limit", pcie_host.name).returncode == 0


def test_a_new_revision_failing_readiness_leaves_the_previous_revisions_bytes_serving(qwen_host, tmp_path):
    host = qwen_host
    old_dir, old = loaded_hashes(host, FIRST)
    assert old == hub_hashes(QWEN)
    pids = {i: main_pid(host, f"sglang@qwen36_ddtree-gpu{i}") for i in range(8)}
    new_commit = json.loads((HUB_STORE / "models" / QWEN_RETRAINED / "manifest.json").read_text())["sha"]
    # The pin moves to a retrained revision (same shapes, other values); its units' servers never get healthy.
    retrained = write_group_data(tmp_path / "new", "lab", (
        "mirrors = copy.deepcopy(base['mirrors'])\n"
        f"mirrors['repos']['Qwen/Qwen3.6-27B'] = '{QWEN_RETRAINED}@{new_commit}'\n"))
    failing = write_group_data(tmp_path / "new", "all", (
        "profiles = copy.deepcopy(base['profiles'])\n"
        f"profiles['qwen36_ddtree']['env'] = {{**profiles['qwen36_ddtree']['env'], 'SPECFLEET_SGLANG_KNOBS': {KNOBS!r}}}\n"
        "profile = 'qwen36_ddtree'"))
    assert retrained == failing
    fleet.ssh(host, f"echo '{{\"health_fail\": true}}' > {KNOBS}")
    result = run_deploy("--limit", host.name, "--data", "ready_timeout_s=15", group_data=retrained)
    assert result.returncode != 0
    assert f"{FIRST} did not generate within 15s" in result.output, result.output[-3000:]
    assert "restored the previous unit, which generates again" in result.output, result.output[-3000:]
    # The new revision was fetched beside the old one; the restored unit loads the old one's bytes.
    new_dir = f"{old_dir.rsplit('/', 1)[0]}/{new_commit}"
    assert fleet.ssh(host, f"cd {new_dir} && sha256sum *.safetensors").split()[::2] == \
        [hub_hashes(QWEN_RETRAINED)[name] for name in sorted(hub_hashes(QWEN_RETRAINED))]
    loaded_dir, loaded = loaded_hashes(host, FIRST)
    assert loaded_dir == old_dir and loaded == hub_hashes(QWEN) != hub_hashes(QWEN_RETRAINED)
    # The other replicas never left the previous revision.
    assert {i: main_pid(host, f"sglang@qwen36_ddtree-gpu{i}") for i in range(1, 8)} == \
        {i: pids[i] for i in range(1, 8)}
    assert all(loaded_hashes(host, f"sglang@qwen36_ddtree-gpu{i}")[1] == hub_hashes(QWEN) for i in (3, 7))


def test_a_switched_revision_keeps_the_previous_one_and_a_second_run_changes_nothing(qwen_host, tmp_path):
    host = qwen_host
    old_dir, _ = loaded_hashes(host, FIRST)
    new_commit = json.loads((HUB_STORE / "models" / QWEN_RETRAINED / "manifest.json").read_text())["sha"]
    retrained = serving("qwen36_ddtree", write_group_data(tmp_path, "lab", (
        "mirrors = copy.deepcopy(base['mirrors'])\n"
        f"mirrors['repos']['Qwen/Qwen3.6-27B'] = '{QWEN_RETRAINED}@{new_commit}'\n")))
    fleet.ssh(host, f"runuser -u sglang-download -- rm -rf {old_dir.rsplit('/', 1)[0]}/{new_commit}")  # an earlier test's
    mark = len(read_request_log(HUB_STATE))
    switched = run_deploy("--limit", host.name, group_data=retrained)
    assert switched.returncode == 0, switched.output[-3000:]
    fetched = {r["path"].rsplit("/", 1)[1] for r in read_request_log(HUB_STATE)[mark:]
               if r["client"] == host.address and r["path"].startswith(f"/{QWEN_RETRAINED}/")}
    assert fetched == {"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"}  # the rest linked
    for i in range(8):
        assert loaded_hashes(host, f"sglang@qwen36_ddtree-gpu{i}")[1] == hub_hashes(QWEN_RETRAINED)
    assert re.search(rf"weights: kept the previous {re.escape(QWEN)} revision \w+ \({re.escape(old_dir)}\)",
                     switched.output), switched.output[-3000:]
    assert fleet.ssh(host, f"test -d {old_dir} && echo kept").strip() == "kept"
    again = run_deploy("--limit", host.name, group_data=retrained)
    assert again.returncode == 0 and changed_operations(again.output) == []
