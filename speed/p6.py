"""P6: installing the REAL sglang==0.5.23 with its full dependency set (torch 2.14.1 with its CUDA 13
libraries, flashinfer, sglang-kernel, ... 207 wheels, ~4 GB) into a fresh venv on a lab host, by the
deploy's installer (the commands `operations.python.virtualenvs.requirement` yields: uv, hash-checked against the
committed lock) against plain `python3 -m venv` + `pip install` of the same lock, with hashes.

Not part of `make test` (it moves several GB): `python -m speed P6`. The wheels are downloaded once
from PyPI on the controller, for the hosts' platform, into SPECFLEET_CACHE or /var/cache/specfleet
(`sglang-0.5.23-index/wheels`), and served to the host by the lab's index code on a port of its own.
Each install starts from nothing: no venv, no uv cache, pip without its cache; the venv is removed
after each run (one installed set is ~10 GB). The order alternates between rounds.
"""

import json
import os
import shlex
import subprocess
import sys
import time

import lab
from speed import labctl
from speed.common import against_target, fmt, log, ratio_summary, summary, write_result
from speed.p4 import host_cpu
from lab import fleet
from lab.config import CONTROLLER_IP, INDEX_URL
from lab.index import HOST_TARGET, start_index
from deployment.python import pinned
from operations.python import virtualenvs
from tests.sglang_real import cache_root
from tests.unit.fakehost import run

TARGET = 0.4
REQUIREMENT = "sglang==0.5.23"
INDEX_DIR = cache_root() / f"{REQUIREMENT.replace('==', '-')}-index"
VENV = "/opt/p6/sglang-venv"
PIP_TMP = "/opt/p6/pip-tmp"
UV = virtualenvs.Uv("/opt/p6")


def download_wheels() -> None:
    """pip download of every file in the committed lock for the hosts' platform (files already there
    are kept: pip checks their hashes). The machine's pip config is left out: it may cap torch."""
    wheels = INDEX_DIR / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    lock = pinned.LOCKS / f"{REQUIREMENT}.txt"
    stamp = INDEX_DIR / ".downloaded.json"  # the lock it was done for, and the files it gave
    if stamp.is_file():
        done = json.loads(stamp.read_text())
        if done["lock"] == lock.read_text() and all((wheels / name).is_file() for name in done["files"]):
            return
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")} | {"PIP_CONFIG_FILE": os.devnull}
    subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--require-hashes", "-r",
                    str(lock), "--dest", str(wheels), *HOST_TARGET], env=env, check=True)
    stamp.write_text(json.dumps({"lock": lock.read_text(), "files": sorted(p.name for p in wheels.glob("*.whl"))}))


def deploy_commands(index_url: str, facts: dict) -> list[str]:
    """What the deploy's SGLang operation runs on a host with these facts, for a fresh venv."""
    commands, _ = run(virtualenvs.requirement, {virtualenvs.VenvRequirement: {"version": None, "fingerprint": None},
                                         virtualenvs.HostPython: facts},
                      path=VENV, requirement=REQUIREMENT, distribution="sglang", index_url=index_url, uv=UV)
    return commands


def pip_commands(index_url: str) -> list[str]:
    """pip's temporary files (every downloaded wheel until the end) go on the venv's disk, as uv's
    cache does: the host's /tmp is nspawn's tmpfs, which 4 GB of wheels overflow (ENOSPC)."""
    lock = virtualenvs.committed_lock(REQUIREMENT)
    return [f"rm -rf {VENV} {PIP_TMP} && python3 -m venv {VENV} && mkdir -m 700 {PIP_TMP}",
            f"printf %s {shlex.quote(lock)} > {VENV}/{virtualenvs.LOCK}",
            f"TMPDIR={PIP_TMP} {VENV}/bin/pip install --quiet --disable-pip-version-check --no-cache-dir "
            f"--index-url {index_url} --require-hashes -r {VENV}/{virtualenvs.LOCK}"]


def timed_install(host, commands: list[str]) -> dict:
    fleet.ssh(host, f"rm -rf {VENV} {UV.cache} {PIP_TMP}", timeout=600)
    cpu0 = host_cpu([host])[host.name]
    started = time.monotonic()
    for command in commands:
        fleet.ssh(host, command, timeout=1800)
    seconds = time.monotonic() - started
    cpu = host_cpu([host])[host.name] - cpu0
    check = fleet.ssh(host, f"{VENV}/bin/python -c 'import importlib.metadata as m; "
                            f"print(m.version(\"sglang\"), m.version(\"torch\"), len(list(m.distributions())))'; "
                            f"du -sm {VENV} | cut -f1")
    fleet.ssh(host, f"rm -rf {VENV} {UV.cache} {PIP_TMP}", timeout=600)
    return {"seconds": round(seconds, 2), "host_cpu_s": round(cpu, 2), "installed": check.split()}


def main(rounds: int = int(os.environ.get("BENCH_ROUNDS", "2"))) -> dict:
    log(f"P6: wheels for {REQUIREMENT} into {INDEX_DIR} (downloaded once)")
    download_wheels()
    labctl.remove_hosts()
    [host] = lab.up("pcie=1", log=log)
    index = start_index(INDEX_DIR, host=CONTROLLER_IP)
    try:
        facts = labctl.host_python(host, UV)
        for command in run(virtualenvs.uv, {virtualenvs.HostPython: facts}, uv=UV, index_url=INDEX_URL)[0]:
            fleet.ssh(host, command, timeout=300)  # uv from the lab's index, as the deploy installs it (not timed)
        facts["uv"] = virtualenvs.UV_VERSION
        log(f"P6 host disks: {fleet.ssh(host, 'df -h /tmp /opt | tail -2')}")
        installers = {"deploy": deploy_commands(index.url, facts), "pip": pip_commands(index.url)}
        runs = {name: [] for name in installers}
        for r in range(rounds):
            for name in (["deploy", "pip"] if r % 2 == 0 else ["pip", "deploy"]):
                runs[name].append(timed_install(host, installers[name]))
                log(f"P6 round {r + 1}/{rounds}: {name} {runs[name][-1]}")
    finally:
        index.stop()
        labctl.remove_hosts()
    seconds = {name: [run["seconds"] for run in v] for name, v in runs.items()}
    result = {
        "measure": f"fresh venv with the real {REQUIREMENT} and its full dependency set from a local index, "
                   "the deploy's installer (uv) / plain pip install of the same hash lock",
        "target": f"<= {TARGET}", "rounds": rounds, "wheels": len(list((INDEX_DIR / "wheels").glob("*.whl"))),
        "install_s": {name: summary(v) for name, v in seconds.items()},
        "ratio": ratio_summary(seconds["deploy"], seconds["pip"]),
        "host_cpu_s": {name: summary([run["host_cpu_s"] for run in v]) for name, v in runs.items()},
        "commands": installers["deploy"][:1] + [c for c in installers["deploy"] if "pip install" in c],
        "cores": os.cpu_count(), "runs": runs,
    }
    result["met"] = result["ratio"]["median"] <= TARGET
    for name in runs:
        print(f"P6 {name:6} install {fmt(result['install_s'][name])}; host CPU {fmt(result['host_cpu_s'][name])}")
    print(against_target("P6 ratio deploy/pip", result["ratio"], TARGET))
    write_result("P6", result)
    return result


if __name__ == "__main__":
    main()
