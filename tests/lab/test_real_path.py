"""The README's real path, as a new user follows it, on a fresh lab host.

The real inventory file (inventory/ct200.py) reaches the host through a `Host ct200` entry of the user's
SSH config (their HOME here), as a user who is not root and deploys with pyinfra's --sudo; the gateway
sits on the box itself (SPECFLEET_GATEWAY_HOST=ct200). The user's site directory (SPECFLEET_SITE) points
the deploy at the lab's hub, package index and NVIDIA repository as its mirrors, with the shipped
revisions (`main`, the DDTree pull request's ref, here a git repository on disk) and the shipped
ready_timeout_s (None). Then: pin.py, --dry, the deploy, a re-run, `pytest tests/deployed --inventory
inventory/ct200.py`, a roll and a rollback, bench.py with a prompts file. Nothing here uses lab/inventory.py.
"""

import json
import os
import re
import shlex
import subprocess
import sys

import pytest

from lab import config, fleet
from lab.index import standin_requirement
from operations.server.host_scripts.engine_answers import NO_THINKING
from tests.conftest import LAB_HOSTS
from tests.helpers import PYINFRA, REPO, SGLANG_UNIT, UNIT_FILE as UNIT, changed_operations, extra_bare_host, operations_started, results_table

pytestmark = pytest.mark.lab

USER = "deployer"
DDTREE = "sglang @ git+https://github.com/sgl-project/sglang@refs/pull/29907/head#subdirectory=python"



def git(*args, cwd) -> str:
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=cwd, check=True,
                          capture_output=True, text=True).stdout.strip()


@pytest.fixture(scope="module")
def box(lab_hosts):
    """A fresh lab host (with its driver), as the CT200 box a user was handed."""
    yield from extra_bare_host(lab_hosts, "pcie", LAB_HOSTS, bare=False)


@pytest.fixture(scope="module")
def user(box, tmp_path_factory):
    """The user's side: a login with sudo on the box, their HOME (SSH config and known hosts), their site
    directory, a git repository standing in for SGLang's, and the environment every command runs with."""
    fleet.ssh(box, f"useradd -m -s /bin/bash {USER} && install -d -m 700 -o {USER} -g {USER} /home/{USER}/.ssh && "
                   f"install -m 600 -o {USER} -g {USER} /root/.ssh/authorized_keys /home/{USER}/.ssh/ && "
                   f"echo '{USER} ALL=(ALL) NOPASSWD: ALL' > /etc/sudoers.d/{USER}")
    home = tmp_path_factory.mktemp("home")
    (home / ".ssh").mkdir(mode=0o700)
    (home / ".ssh" / "config").write_text(
        f"Host ct200\n    HostName {box.address}\n    User {USER}\n    IdentityFile {fleet.SSH_KEY}\n")
    keys = subprocess.run(["ssh-keyscan", "-t", "ed25519", box.address], capture_output=True, text=True,
                          check=True, timeout=30).stdout
    (home / ".ssh" / "known_hosts").write_text(keys)  # StrictHostKeyChecking yes, as the inventory asks

    sglang = tmp_path_factory.mktemp("sglang") / "sglang.git"
    sglang.mkdir()
    git("init", "-q", "-b", "main", cwd=sglang)
    (sglang / "README").write_text("one\n")
    git("add", ".", cwd=sglang)
    git("commit", "-q", "-m", "one", cwd=sglang)
    git("update-ref", "refs/pull/29907/head", "HEAD", cwd=sglang)

    site = tmp_path_factory.mktemp("site")
    (site / "group_data").mkdir()
    (site / "group_data" / "all.py").write_text(
        "# This site's mirrors: the lab's hub, package index and NVIDIA repository.\n"
        f"hf_endpoint = {config.HUB_URL!r}\n"
        f"pip_index_url = {config.INDEX_URL!r}\n"
        f"nvidia_repo_url = {config.APT_URL!r}\n"
        "allow_http_nvidia_repo = True  # the lab's repository is served over plain HTTP\n"
        "allow_http_hub = allow_http_index = True  # so are its hub and its index\n"
        "mirrors['repos'].update({'moonshotai/Kimi-K2.6': 'lab/Kimi-K2.6-tiny',\n"
        "                         'z-lab/Kimi-K2.6-DFlash': 'lab/Kimi-K2.6-DFlash-tiny',\n"
        "                         'Qwen/Qwen3.6-27B': 'lab/Qwen3.6-27B-tiny',\n"
        "                         'z-lab/Qwen3.6-27B-DFlash': 'lab/Qwen3.6-27B-DFlash-tiny'})\n"
        f"mirrors['requirements'].update({{'sglang==0.5.23': {standin_requirement('0.5.23+lab')!r},\n"
        f"    {DDTREE!r}: 'sglang @ git+file://{sglang}@refs/pull/29907/head#subdirectory=python'}})\n"
        "# The lab's stand-ins for what needs a GPU.\n"
        "bench_tokenizer = 'lab/sglang_standin/bench_tokenizer'\n"
        "gpu_smoke_timeout_s = 60  # the lab's all-reduce stand-in answers in seconds\n")
    env = {key: value for key, value in os.environ.items() if not key.startswith("SPECFLEET_")}
    env.update(HOME=str(home), SPECFLEET_SITE=str(site), SPECFLEET_GATEWAY_HOST="ct200", HF_TOKEN="hf_lab_granted",
               SPECFLEET_LAB_ID=str(config.LAB_ID))
    yield dict(env=env, site=site, sglang=sglang, home=home)


def run(user, *command, timeout=600) -> subprocess.CompletedProcess:
    """A command as the user types it, from the checkout (pyinfra, pin.py, pytest, rollout.py)."""
    program = {"pyinfra": [str(PYINFRA)], "python": [sys.executable]}[command[0]]
    result = subprocess.run([*program, *command[1:]], cwd=REPO, env=user["env"], capture_output=True, text=True,
                            timeout=timeout)
    result.output = result.stdout + result.stderr
    return result


def refusals(output: str) -> list[str]:
    return re.findall(r"^\s*\[ct200\] (ct200: .*)$", output, flags=re.M)


def test_pin_and_dry_run_tell_what_the_first_deploy_would_refuse(user, box):
    dry = run(user, "pyinfra", "inventory/ct200.py", "deploy.py", "--dry")
    assert dry.returncode == 1, dry.output[-3000:]  # a refused host fails --dry: it gates a change
    said = refusals(dry.output)
    assert said[0] == ("ct200: the deploy logged in as deployer, not root: add --sudo to the pyinfra command (with "
                       "passwordless sudo for that user), or log in as root")
    assert any(line.startswith("ct200: lab/Kimi-K2.6-tiny: revision 'main' is not a commit") and
               "python pin.py INVENTORY" in line for line in said), said
    assert "Service user" not in dry.output.split("--> Detected changes:")[1]  # the run would stop there

    real = run(user, "pyinfra", "-y", "inventory/ct200.py", "deploy.py")  # the same refusals, in the same words
    assert real.returncode != 0 and refusals(real.output) == said, real.output[-3000:]
    assert operations_started(real.output) == ["Preflight"]
    assert fleet.ssh(box, f"test -e {UNIT} && echo written || echo none").strip() == "none"

    pinned = run(user, "python", "pin.py", "inventory/ct200.py")
    assert pinned.returncode == 0, pinned.output
    assert re.search(r"pin: lab/Kimi-K2.6-tiny@main +cab62ee5866130af4b3f1e1a6a83cf419015a31f +new", pinned.stdout)
    ddtree = run(user, "python", "pin.py", "inventory/ct200.py", "--profile", "qwen36_ddtree")
    head = git("rev-parse", "HEAD", cwd=user["sglang"])
    assert f"file://{user['sglang']}@refs/pull/29907/head  {head}  new" in ddtree.stdout, ddtree.output
    pins = json.loads((user["site"] / "pins.json").read_text())
    assert len(pins["repos"]) == 4 and list(pins["git"].values()) == [head]

    dry = run(user, "pyinfra", "inventory/ct200.py", "deploy.py", "--dry", "--sudo")
    assert dry.returncode == 0 and refusals(dry.output) == [], dry.output[-3000:]
    planned = dry.output.split("--> Detected changes:")[1]
    for operation in ("SGLang service", "Gateway service", "Prometheus service"):
        assert re.search(rf"^\s*{operation}( \S+)?\s+1 \(ct200\)", planned, flags=re.M), planned  # + the replica
    qwen = run(user, "pyinfra", "inventory/ct200.py", "deploy.py", "--dry", "--sudo", "--data", "profile=qwen36_ddtree")
    assert refusals(qwen.output) == [], qwen.output[-3000:]  # its pull request's ref is pinned too

    git("commit", "-q", "--allow-empty", "-m", "two", cwd=user["sglang"])
    git("update-ref", "refs/pull/29907/head", "HEAD", cwd=user["sglang"])
    moved = run(user, "python", "pin.py", "inventory/ct200.py", "--profile", "qwen36_ddtree")
    assert f"{git('rev-parse', 'HEAD', cwd=user['sglang'])}  moved from {head[:12]}" in moved.stdout, moved.output


def test_the_deploy_through_sudo_serves_behind_its_gateway_and_ends_with_one_table(user, box):
    deployed = run(user, "pyinfra", "-y", "inventory/ct200.py", "deploy.py", "--sudo")
    assert deployed.returncode == 0, deployed.output[-4000:]
    table = deployed.output.split("--> Summary:")[1].splitlines()
    cells = [re.split(r"\s{2,}", line.strip()) for line in table[1:3]]
    assert cells[0] == ["host", "class", "model", "endpoint", "gateway", "state", "accept length",
                        "KV tokens (engine of plan)", "weights fetched (hub, peers, rate)"]
    assert cells[1][:7] == ["ct200", "rtx_pro_6000_pcie", "kimi-k2.6", "http://127.0.0.1:30000 (on the host)",
                            "http://127.0.0.1:30080 (on the host)", "serving DFLASH, gateway routing to 1 worker",
                            "3.45"]
    assert re.fullmatch(r"[\d,]+ of [\d,]+", cells[1][7]), cells[1]  # the engine's own tokens beside the plan's
    assert re.search(r"weights: \d+\.\d\d GB complete", deployed.output)
    ask = {"model": "kimi-k2.6", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 8,
           **NO_THINKING}  # Kimi thinks by default: a plain answer is asked for
    through_gateway = fleet.ssh(box, "curl -sf -m 20 localhost:30080/v1/chat/completions -H 'Content-Type: "
                                     f"application/json' -d {shlex.quote(json.dumps(ask))}")
    assert json.loads(through_gateway)["choices"][0]["message"]["content"]
    again = run(user, "pyinfra", "-y", "inventory/ct200.py", "deploy.py", "--sudo")
    assert again.returncode == 0, again.output[-3000:]
    assert changed_operations(again.output) == [], "changed on a re-run"


def test_pytest_tests_deployed_verifies_the_box_through_sudo(user, box):
    verified = run(user, "python", "-m", "pytest", "tests/deployed", "--inventory", "inventory/ct200.py", "--sudo",
                   "-q", "-p", "no:cacheprovider")
    assert verified.returncode == 0, verified.output[-4000:]
    assert re.search(r"\b(2[0-9]|3[0-9]) passed", verified.output), verified.output[-2000:]
    assert "test_gateway.py" not in verified.output  # its checks ran and passed (-q names only failures)
    plain = run(user, "python", "-m", "pytest", "tests/deployed/test_unit.py", "--inventory", "inventory/ct200.py",
                "-q", "-p", "no:cacheprovider", "-x")
    assert plain.returncode != 0 and ("ct200: the checks run as deployer, but they read root's files: add --sudo"
                                      in plain.output), plain.output[-2000:]
    nothing = run(user, "python", "-m", "pytest", "tests/deployed", "-q", "-p", "no:cacheprovider")
    assert nothing.returncode == 4 and "ERROR: tests/deployed verifies deployed hosts: name them with --inventory" \
        in nothing.output and "lab:" not in nothing.output, nothing.output[-2000:]
    hosts = run(user, "python", "-m", "pytest", "tests/deployed", "--hosts", f"paramiko://{USER}@{box.address}",
                "--ssh-identity-file", str(fleet.SSH_KEY), "--sudo", "-q", "-p", "no:cacheprovider")
    assert hosts.returncode == 0 and re.search(r"\b\d\d passed", hosts.output), hosts.output[-3000:]


def test_a_roll_through_sudo_restarts_and_a_crash_loop_is_rolled_back(user, box):
    all_py = user["site"] / "group_data" / "all.py"
    shipped = all_py.read_text()
    all_py.write_text(shipped + "profiles['kimi_k26_dflash']['speculative']['num_draft_tokens'] = 6\n")
    rolled = run(user, "python", "rollout.py", "inventory/ct200.py", "--sudo")
    assert rolled.returncode == 0 and "rollout: 1 batch done" in rolled.output, rolled.output[-3000:]
    assert "--speculative-num-draft-tokens 6" in fleet.ssh(box, f"cat {UNIT}")
    changed = {op for op, (_, success, _, _) in results_table(rolled.output).items() if success != "-"}
    assert {f"Drain {SGLANG_UNIT} from the gateway", f"SGLang service {SGLANG_UNIT}", f"SGLang generates {SGLANG_UNIT}",
            f"{SGLANG_UNIT} back in the gateway"} <= changed

    knobs = "/etc/specfleet-lab/crash-loop.json"
    fleet.ssh(box, f"echo '{{\"exit_after_s\": 1, \"health_fail\": true}}' > {knobs}")
    try:
        all_py.write_text(shipped + f"profiles['kimi_k26_dflash']['env'] = {{'SPECFLEET_SGLANG_KNOBS': {knobs!r}}}\n")
        crashed = run(user, "pyinfra", "-y", "inventory/ct200.py", "deploy.py", "--sudo", timeout=300)
    finally:
        fleet.ssh(box, f"rm -f {knobs}")
        all_py.write_text(shipped)
    out = crashed.output
    assert crashed.returncode != 0 and f"{SGLANG_UNIT} crash-loops: the server died 3 times" in out, out[-3000:]
    assert "restored the previous unit, which generates again" in out  # the rollback ran as root
    assert "lab stand-in fault: exit_after_s" in out  # the journal, which only root reads here
    back = run(user, "pyinfra", "-y", "inventory/ct200.py", "deploy.py", "--sudo")
    assert back.returncode == 0 and "--speculative-num-draft-tokens 8" in fleet.ssh(box, f"cat {UNIT}"), \
        back.output[-3000:]


def test_bench_with_a_prompts_file_leaves_the_gateway_and_comes_back(user, box, tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("\n".join(json.dumps({"text": text}) for text in (
        "Explain speculative decoding to a new engineer in three sentences.",
        "Write a Python function that reverses a singly linked list, with a test.",
        "A train covers 120 km in 1.5 hours. What is its average speed? Show the steps.")) + "\n")
    results = tmp_path / "results"
    bench = run(user, "pyinfra", "-y", "inventory/ct200.py", "bench.py", "--sudo", "--data", f"prompts={prompts}",
                "--data", "modes=ar,dflash", "--data", "concurrency=1", "--data", "requests=3",
                "--data", f"results_dir={results}", timeout=900)
    assert bench.returncode == 0, bench.output[-4000:]
    assert f"ct200: {SGLANG_UNIT} back in its gateways (ct200)" in bench.output
    ops = operations_started(bench.output)
    assert ops.index(f"Drain {SGLANG_UNIT} from the gateway") == ops.index("Benchmark sweep kimi_k26_dflash") - 1
    (summary,) = results.glob("*/ct200/summary.json")
    doc = json.loads(summary.read_text())
    assert doc["workload"]["prompts"] == "prompts.jsonl" and doc["workload"]["prompt_count"] == 3
    assert doc["modes"]["dflash"]["levels"]["1"]["accept_length"] == 3.45
    # Then through the gateway on the box, whose only worker is the box's replica: the deployed dflash.
    through = doc["gateways"]["ct200"]
    assert through["mode"] == "dflash" and through["levels"]["1"]["requests_completed"] == 3
    assert list(through["generated_tokens"]) == [SGLANG_UNIT] and through["generated_tokens"][SGLANG_UNIT] > 0
    workers = json.loads(fleet.ssh(box, "curl -sf -m 10 localhost:30080/workers"))
    assert [w["url"] for w in workers["workers"]] == ["http://127.0.0.1:30000"]
    after = run(user, "pyinfra", "-y", "inventory/ct200.py", "deploy.py", "--sudo")
    assert changed_operations(after.output) == [], "changed after the bench"
