"""P1b: the no-op deploy (P1) against Ansible running an equivalent no-op playbook on the same hosts.

ansible-core comes from PyPI into its own venv (build/ansible-venv, installed once).
speed/ansible/noop.yml makes the same checks as the no-op deploy: preflight facts, the
persistence daemon, service user, token file, API key, both virtualenvs' versions and
requirement fingerprints, host scripts, weights manifests (the deploy's own state script),
the SGLang env and unit files (the deployed files, checksummed by Ansible's copy), the
service state, and the readiness probe. Ansible runs with its defaults (SSH ControlPersist
60s, 5 forks, no pipelining); with BENCH_ANSIBLE_PIPELINING=1 one run with pipelining on is
timed too, against one more pyinfra run.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import lab
from speed.common import (BENCH, REPO, TOKEN, WORK, against_target, deploy, fmt, log, ratio_summary,
                          run_timed, summary, write_result)
from speed.p1 import SPEC, noop_run
from lab import fleet
from lab.repos import KIMI, KIMI_DFLASH, repo_dir
from lab.services import HUB_STORE
from speed.repos import listing
from deployment.server.config import venv_name
from operations.basics.host_programs import program
from operations.python.virtualenvs import fingerprint

TARGET = 0.5
ANSIBLE_VENV = REPO / "build" / "ansible-venv"
ANSIBLE_REQUIREMENT = "ansible-core>=2.17,<2.20"
PLAYBOOK = BENCH / "ansible" / "noop.yml"



# The default profile's one replica on a lab host (group_data layouts: Kimi K2.6 over all eight GPUs).
UNIT = "sglang@kimi_k26_dflash-gpu0-7"
UNIT_FILE, ENV_FILE = f"/etc/systemd/system/{UNIT}.service", f"/etc/specfleet/{UNIT}.env"

def ensure_ansible() -> Path:
    playbook_bin = ANSIBLE_VENV / "bin" / "ansible-playbook"
    if not playbook_bin.exists():
        log(f"P1b: installing {ANSIBLE_REQUIREMENT} into {ANSIBLE_VENV.relative_to(REPO)}")
        subprocess.run([sys.executable, "-m", "venv", str(ANSIBLE_VENV)], check=True)
        subprocess.run([str(ANSIBLE_VENV / "bin" / "pip"), "install", "-q", "--disable-pip-version-check",
                        ANSIBLE_REQUIREMENT], check=True)
    return playbook_bin


def prepare(hosts) -> tuple[Path, Path]:
    """Inventory and vars for the playbook, from the lab fleet and the converged hosts."""
    out = WORK / "ansible"
    files_dir = out / "files"
    for host in hosts:
        (files_dir / host.name).mkdir(parents=True, exist_ok=True)
        for remote, name in ((UNIT_FILE, "sglang.service"), (ENV_FILE, "sglang.env")):
            (files_dir / host.name / name).write_text(fleet.ssh(host, f"cat {remote}"))
    inventory = out / "inventory.ini"
    inventory.write_text("[lab]\n" + "".join(
        f"{h.name} ansible_host={h.address} ansible_user=root ansible_ssh_private_key_file={fleet.SSH_KEY} "
        "ansible_ssh_common_args='-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null' "
        "ansible_python_interpreter=/usr/bin/python3\n" for h in hosts))
    sys.path.insert(0, str(REPO))
    import runpy
    all_data = runpy.run_path(str(REPO / "group_data" / "all.py"))
    lab_data = runpy.run_path(str(REPO / "lab" / "group_data" / "lab.py"))
    profile = all_data["profiles"][all_data["profile"]]
    sglang_req = lab_data["mirrors"]["requirements"].get(profile["sglang"]["requirement"],
                                                         profile["sglang"]["requirement"])
    index = lab_data["pip_index_url"]
    commits = {repo: json.loads((repo_dir(HUB_STORE, repo) / "manifest.json").read_text())["sha"]
               for repo in (KIMI, KIMI_DFLASH)}
    variables = {
        "hf_token": TOKEN,
        "served_model_name": profile["served_model_name"],
        "venv_checks": [
            {"venv": f"/opt/specfleet/{venv_name(sglang_req, index)}", "dist": "sglang", "version": profile["sglang"]["version"],
             "fingerprint": fingerprint(sglang_req, index)},
        ],
        "host_scripts": sorted(str(p) for p in (REPO / "operations" / "host_scripts").glob("*.py")),
        "weights_state_script": program("weights_state"),
        "weights_listings": json.dumps({dir_: {f["path"]: f["size"] for f in listing(repo)} for dir_, repo in (
            (f"/srv/specfleet/models/moonshotai--Kimi-K2.6/{commits[KIMI]}", KIMI),
            (f"/srv/specfleet/models/z-lab--Kimi-K2.6-DFlash/{commits[KIMI_DFLASH]}", KIMI_DFLASH))}, sort_keys=True),
        "target_dir": f"/srv/specfleet/models/moonshotai--Kimi-K2.6/{commits[KIMI]}",
        "drafter_dir": f"/srv/specfleet/models/z-lab--Kimi-K2.6-DFlash/{commits[KIMI_DFLASH]}",
        "unit_name": UNIT, "unit_file": UNIT_FILE, "env_file": ENV_FILE,
        "target_commit": commits[KIMI], "drafter_commit": commits[KIMI_DFLASH],
        "files_dir": str(files_dir),
    }
    vars_file = out / "vars.json"
    vars_file.write_text(json.dumps(variables, indent=1))
    return inventory, vars_file


def ansible_run(playbook_bin, inventory, vars_file, pipelining=False):
    env = {"ANSIBLE_HOST_KEY_CHECKING": "False", "ANSIBLE_LOCAL_TEMP": str(WORK / "ansible" / "tmp"),
           "ANSIBLE_PIPELINING": "True" if pipelining else "False", "ANSIBLE_NOCOLOR": "1",
           "ANSIBLE_RETRY_FILES_ENABLED": "False",
           "ANSIBLE_SSH_CONTROL_PATH_DIR": str(WORK / "ansible" / "cp")}
    run = run_timed([playbook_bin, "-i", inventory, "-e", f"@{vars_file}", PLAYBOOK], env=env).check()
    recap = [line for _, line in run.lines if "changed=" in line]
    if any("changed=0" not in line or "failed=0" not in line for line in recap) or not recap:
        raise RuntimeError("P1b: the Ansible playbook was not a clean no-op:\n" + run.output[-3000:])
    return run


def main(rounds: int = min(int(os.environ.get("BENCH_ROUNDS", "5")), 3)) -> dict:
    playbook_bin = ensure_ansible()
    version = subprocess.run([str(playbook_bin), "--version"], capture_output=True, text=True).stdout.split("\n")[0]
    hosts = lab.up(SPEC, log=log)
    log("P1b: converging deploy")
    deploy().check()
    inventory, vars_file = prepare(hosts)
    ansible_run(playbook_bin, inventory, vars_file)  # warm (and checks it is a no-op)
    noop_run()

    # Ansible takes ~45s a run here: at most 3 rounds, and pipelining is timed once, for reference.
    pyinfra_s, ansible_s = [], []
    for r in range(rounds):
        kinds = [("pyinfra", noop_run), ("ansible", lambda: ansible_run(playbook_bin, inventory, vars_file))]
        for kind, fn in (kinds if r % 2 == 0 else kinds[::-1]):
            (pyinfra_s if kind == "pyinfra" else ansible_s).append(fn().seconds)
        log(f"P1b round {r + 1}/{rounds}: pyinfra {pyinfra_s[-1]:.2f}s ansible {ansible_s[-1]:.2f}s")
    ansible_pipe_s, pyinfra_s_pipe = [], []
    if os.environ.get("BENCH_ANSIBLE_PIPELINING"):
        ansible_pipe_s = [ansible_run(playbook_bin, inventory, vars_file, True).seconds]
        pyinfra_s_pipe = [noop_run().seconds]

    result = {
        "measure": "no-op deploy.py (pyinfra) / equivalent no-op Ansible playbook (speed/ansible/noop.yml), 3 hosts",
        "hosts": SPEC, "target": f"<= {TARGET}", "rounds": rounds, "ansible": version,
        "pyinfra_noop_s": summary(pyinfra_s), "ansible_noop_s": summary(ansible_s),
        "ratio": ratio_summary(pyinfra_s, ansible_s),
    }
    if ansible_pipe_s:
        result["ansible_pipelining_noop_s"] = summary(ansible_pipe_s)
        result["ratio_vs_ansible_pipelining"] = ratio_summary(pyinfra_s_pipe, ansible_pipe_s)
    result["met"] = result["ratio"]["median"] <= TARGET
    print(f"P1b pyinfra no-op          {fmt(result['pyinfra_noop_s'])}")
    print(f"P1b Ansible no-op          {fmt(result['ansible_noop_s'])}  ({version})")
    print(against_target("P1b ratio pyinfra/Ansible ", result["ratio"], TARGET))
    if ansible_pipe_s:
        print(f"P1b Ansible, pipelining    {fmt(result['ansible_pipelining_noop_s'])}; ratio "
              f"{fmt(result['ratio_vs_ansible_pipelining'], '')}")
    write_result("P1b", result)
    return result


if __name__ == "__main__":
    main()
