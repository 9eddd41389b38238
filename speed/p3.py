"""P3 and P3b: a fresh download of the lab's benchmark repo through the deploy, against parallel
curl (P3) and against huggingface_hub's own `hf download` (P3b), measured side by side.

The repo: lab/bench-2g-64 (2 GiB in 64 shards) as the deploy's target (its drafter
comes along, as in any deploy). Each round, on one host, in alternating order:
  deploy:   the deploy's weights stage (speed/weights_deploy.py) into an emptied weights_dir;
            timed as the Weights operation's wall time (primary) and the whole run;
  curl:     the same files (target and drafter) from the same hub's resolve URLs, following
            the CDN redirect as huggingface_hub does, 8 at a time (xargs -P8, huggingface_hub's
            default max_workers), timed on the host;
  hf:       `hf download REPO --revision COMMIT --local-dir DIR --max-workers 8` (huggingface_hub
            2.4.0 installed for the bench by the deploy's installer: the deploy itself needs none),
            target and drafter at once (as the deploy's two units run), on the host;
  fetch:    the deploy's host fetcher alone (host_scripts/fetch_weights.py, both repos at once, as
            its units run it), with hashing (as deployed) and without (the hash objects replaced
            by ones that do nothing and agree, a what-if here only), back to back in alternating
            order: what hashing while streaming costs (issue #10), and, against `deploy`, what the
            deploy adds around the fetcher (pyinfra, unit start, progress polling).
"""

import json
import os
import shlex

import lab
from speed import labctl, repos
from speed.common import against_target, deploy, fmt, log, operation_times, ratio_summary, summary, write_result
from lab import fleet
from lab.config import HUB_URL, INDEX_URL, TOKEN_GRANTED
from lab.repos import KIMI_DFLASH
from operations.python import virtualenvs
from tests.unit.fakehost import run

SPEC = "pcie=2,b200=1"
TARGET, TARGET_B = 1.25, 1.0
REPO_ID, SHARDS = "lab/bench-2g-64", 64
WEIGHTS_DIR = "/srv/specfleet/bench/p3"
CURL_DIR = "/srv/specfleet/bench/p3-curl"
HF_DIR = "/srv/specfleet/bench/p3-hf"
FETCH_DIR = "/srv/specfleet/bench/p3-fetch"
FETCHER_PY = "/usr/bin/python3"  # as the weights units run the fetcher
HF_VENV = "/opt/p3/hf-venv"
HF_CLI = f"{HF_VENV}/bin/hf"
HF_REQUIREMENT = "huggingface_hub==2.4.0"  # hash-checked against operations/python/locks/
SCRIPTS = "/opt/specfleet/bin"  # the deploy's host scripts (layout.host_scripts)


def manifest_files(repo_id: str) -> tuple[str, list[str]]:
    manifest = json.loads((repos.files_of(repo_id).parent / "manifest.json").read_text())
    return manifest["sha"], [f["path"] for f in manifest["files"]]


def timed_on_host(host, script: str, timeout: float = 600, cpu: list | None = None) -> float:
    """Wall seconds of SCRIPT on HOST; its CPU seconds (user + sys, children included) go to CPU."""
    wrapped = (f"TIMEFORMAT='cpu %U %S'; s=$(date +%s%N); {{ time ( {script} ) ; }} 2>&1; rc=$?; "
               "e=$(date +%s%N); echo $rc $((e - s))")
    out = fleet.ssh(host, f"bash -c {shlex.quote(wrapped)}", timeout=timeout)
    rc, ns = out.split()[-2:]
    if rc != "0":
        raise RuntimeError(f"on {host.name}: `{script[:200]}` exited {rc}:\n{out[-2000:]}")
    if cpu is not None:
        user, system = next(line for line in out.splitlines() if line.startswith("cpu ")).split()[1:]
        cpu.append(float(user) + float(system))
    return int(ns) / 1e9


def curl_script(urls: list[tuple[str, str]], dest: str) -> str:
    """xargs -P8 over 'URL PATH' lines: curl -L each to DEST/PATH, the token only to the hub."""
    lines = "\n".join(f"{url} {path}" for url, path in urls)
    fetch = (f"curl -sSfL --max-redirs 3 -H {shlex.quote('Authorization: Bearer ' + TOKEN_GRANTED)} "
             f"-o {shlex.quote(dest)}/\"$2\" \"$1\"")
    return (f"rm -rf {shlex.quote(dest)} && mkdir -p {shlex.quote(dest)} && "
            f"printf '%s\\n' {shlex.quote(lines)} | xargs -P8 -L1 sh -c {shlex.quote(fetch)} sh")


def hf_script(repo_ids: list[tuple[str, str]], dest: str) -> str:
    """`hf download` of each repo at its commit into DEST/<repo>, 8 workers each, all repos at once."""
    downloads = " & ".join(
        f"{HF_CLI} download {shlex.quote(repo)} --revision {rev} --max-workers 8 --quiet "
        f"--local-dir {shlex.quote(dest + '/' + repo.replace('/', '--'))} >/dev/null" for repo, rev in repo_ids)
    return (f"rm -rf {shlex.quote(dest)}; export HF_ENDPOINT={HUB_URL} HF_TOKEN={TOKEN_GRANTED} "
            f"HF_HOME={dest}/hf-home HF_HUB_DISABLE_PROGRESS_BARS=1; {downloads} & wait_all")


# The fetcher with its hash objects replaced by ones that take the bytes and agree with the hub:
# a what-if for the bench only (the deployed fetcher has no way to skip hashing).
UNHASHED = ("import weights_manifest\n"
            "class Unhashed:\n"
            "    def __init__(self, entry): self.entry = entry\n"
            "    def update(self, data): pass\n"
            "    def hexdigest(self): return weights_manifest.expected_digest(self.entry)\n"
            "weights_manifest.digest_for = Unhashed\n")


def install_hf_cli(host) -> None:
    """huggingface_hub's CLI into HF_VENV by the deploy's own installer (uv, hash-checked), unless there."""
    uv = virtualenvs.Uv("/opt/specfleet")  # where the converging deploy put uv
    facts = labctl.host_python(host, uv)
    state = virtualenvs.VenvRequirement().process(
        fleet.ssh(host, virtualenvs.VenvRequirement().command(HF_VENV, "huggingface_hub")).splitlines())
    commands, _ = run(virtualenvs.requirement, {virtualenvs.VenvRequirement: state, virtualenvs.HostPython: facts}, path=HF_VENV,
                      requirement=HF_REQUIREMENT, distribution="huggingface_hub", index_url=INDEX_URL, uv=uv)
    for command in commands:
        fleet.ssh(host, command, timeout=600)


def fetch_script(specs: list[dict], hashed: bool) -> str:
    """The deploy's fetcher on each SPEC at once, as its units run it (host Python, HF_ENDPOINT, token)."""
    code = ("import sys\n" + ("" if hashed else UNHASHED)
            + "import fetch_weights\nsys.exit(fetch_weights.main(sys.argv[1]))\n")
    dirs = " ".join(shlex.quote(spec["local_dir"]) for spec in specs)
    runs = " & ".join(f"{FETCHER_PY} -c {shlex.quote(code)} {FETCH_DIR}/{i}.json >/dev/null" for i in range(len(specs)))
    return (f"rm -rf {dirs}; cd {SCRIPTS} || exit 1; export HF_ENDPOINT={HUB_URL} HF_TOKEN={TOKEN_GRANTED}; "
            f"{runs} & wait_all")


# `wait` alone exits 0 whatever its jobs did: each job's status is checked.
WAIT_ALL = "wait_all() { for job in $(jobs -p); do wait $job || return 1; done; }; "


def main(rounds: int = int(os.environ.get("BENCH_ROUNDS", "5"))) -> dict:
    hosts = lab.up(SPEC, log=log)
    host = hosts[0]
    log(f"P3: converging deploy on {host.name} (service user, uv, host scripts); {HF_REQUIREMENT} for P3b")
    deploy("--limit", host.name).check()
    install_hf_cli(host)
    commit = repos.ensure(REPO_ID, repos.GB2, SHARDS)
    override = repos.target_override("p3", REPO_ID, commit, WEIGHTS_DIR)
    drafter_sha, drafter_files = manifest_files(KIMI_DFLASH)
    _, target_files = manifest_files(REPO_ID)
    urls = ([(f"{HUB_URL}/{REPO_ID}/resolve/{commit}/{p}", p) for p in target_files]
            + [(f"{HUB_URL}/{KIMI_DFLASH}/resolve/{drafter_sha}/{p}", f"drafter-{p}") for p in drafter_files])
    pinned = [(REPO_ID, commit), (KIMI_DFLASH, drafter_sha)]
    specs = [{"repo_id": repo, "commit": rev, "local_dir": f"{FETCH_DIR}/{repo.replace('/', '--')}",
              "files": repos.listing(repo)} for repo, rev in pinned]
    fleet.ssh(host, f"mkdir -p {FETCH_DIR} && " + " && ".join(
        f"printf %s {shlex.quote(json.dumps(spec))} > {FETCH_DIR}/{i}.json" for i, spec in enumerate(specs)))
    total = sum(f["size"] for f in json.loads((repos.files_of(REPO_ID).parent / "manifest.json").read_text())["files"])
    log(f"P3: {REPO_ID} ({len(target_files)} files, {total} bytes) + drafter, on {host.name}")

    times = {kind: [] for kind in ("deploy_op", "deploy_run", "curl", "hf", "hashed", "unhashed")}
    cpu = {kind: [] for kind in ("curl", "hf", "hashed", "unhashed")}
    on_host = {"curl": curl_script(urls, CURL_DIR), "hf": hf_script(pinned, HF_DIR),
               "hashed": fetch_script(specs, hashed=True), "unhashed": fetch_script(specs, hashed=False)}
    for r in range(rounds):
        order = ["deploy", "curl", "hf", "hashed", "unhashed"]
        for kind in order if r % 2 == 0 else order[::-1]:
            if kind == "deploy":
                fleet.ssh(host, f"rm -rf {WEIGHTS_DIR}")
                run = deploy("--limit", host.name, group_data=override,
                             deploy_file="speed/weights_deploy.py").check()
                times["deploy_op"].append(operation_times(run)["operations"]["Weights"])
                times["deploy_run"].append(run.seconds)
            else:
                times[kind].append(timed_on_host(host, WAIT_ALL + on_host[kind], cpu=cpu[kind]))
        fleet.ssh(host, f"rm -rf {CURL_DIR} {HF_DIR} " + " ".join(spec["local_dir"] for spec in specs))
        log(f"P3 round {r + 1}/{rounds}: deploy {times['deploy_op'][-1]:.2f}s (run {times['deploy_run'][-1]:.2f}s), "
            f"curl -P8 {times['curl'][-1]:.2f}s, hf download {times['hf'][-1]:.2f}s, fetcher hashed "
            f"{times['hashed'][-1]:.2f}s / unhashed {times['unhashed'][-1]:.2f}s")
    fleet.ssh(host, f"rm -rf {WEIGHTS_DIR} {FETCH_DIR}")

    hash_cost = [(on - off) / op for on, off, op in zip(times["hashed"], times["unhashed"], times["deploy_op"])]
    common = {"host": host.name, "rounds": rounds, "bytes": total,
              "deploy_weights_op_s": summary(times["deploy_op"]), "deploy_weights_run_s": summary(times["deploy_run"]),
              "curl_p8_s": summary(times["curl"]), "hf_download_s": summary(times["hf"]),
              "fetcher_hashed_s": summary(times["hashed"]), "fetcher_unhashed_s": summary(times["unhashed"]),
              "curl_cpu_s": summary(cpu["curl"]), "hf_download_cpu_s": summary(cpu["hf"]),
              "fetcher_hashed_cpu_s": summary(cpu["hashed"]), "fetcher_unhashed_cpu_s": summary(cpu["unhashed"]),
              "ratio_fetcher_hashed_vs_unhashed": ratio_summary(times["hashed"], times["unhashed"]),
              "hash_cost_share_of_deploy": summary(hash_cost),
              "ratio_deploy_vs_fetcher": ratio_summary(times["deploy_op"], times["hashed"]),
              "ratio_fetcher_vs_curl": ratio_summary(times["hashed"], times["curl"]),
              "ratio_hf_download_vs_curl": ratio_summary(times["hf"], times["curl"]),
              "curl_MBps": round(total / summary(times["curl"])["median"] / 1e6, 1),
              "hf_download_MBps": round(total / summary(times["hf"])["median"] / 1e6, 1),
              "deploy_MBps": round(total / summary(times["deploy_op"])["median"] / 1e6, 1)}
    p3 = {"measure": "fresh download of a 2 GiB 64-shard repo (+ drafter) through the deploy / curl xargs -P8",
          "target": f"<= {TARGET}", **common, "ratio": ratio_summary(times["deploy_op"], times["curl"]),
          "ratio_whole_run": ratio_summary(times["deploy_run"], times["curl"])}
    p3["met"] = p3["ratio"]["median"] <= TARGET
    p3b = {"measure": "fresh download of a 2 GiB 64-shard repo (+ drafter) through the deploy / hf download "
                      "--max-workers 8 (both repos at once, on the host)",
           "target": f"<= {TARGET_B}", **common, "ratio": ratio_summary(times["deploy_op"], times["hf"]),
           "ratio_whole_run": ratio_summary(times["deploy_run"], times["hf"])}
    p3b["met"] = p3b["ratio"]["median"] <= TARGET_B
    print(f"P3 deploy Weights op    {fmt(p3['deploy_weights_op_s'])} ({p3['deploy_MBps']} MB/s)")
    print(f"P3 deploy whole run     {fmt(p3['deploy_weights_run_s'])}")
    print(f"P3 curl xargs -P8       {fmt(p3['curl_p8_s'])} ({p3['curl_MBps']} MB/s)")
    print(f"P3 hf download          {fmt(p3['hf_download_s'])} ({p3['hf_download_MBps']} MB/s)")
    print(f"P3 fetcher alone        hashed {fmt(p3['fetcher_hashed_s'])}, unhashed {fmt(p3['fetcher_unhashed_s'])}")
    print(f"P3 CPU on the host (user+sys): curl {fmt(p3['curl_cpu_s'])}, hf download {fmt(p3['hf_download_cpu_s'])}, "
          f"fetcher hashed {fmt(p3['fetcher_hashed_cpu_s'])}, unhashed {fmt(p3['fetcher_unhashed_cpu_s'])}")
    print(f"P3 hashing while streaming: fetcher hashed/unhashed {fmt(p3['ratio_fetcher_hashed_vs_unhashed'], '')}; "
          f"(hashed - unhashed) / deploy {fmt(p3['hash_cost_share_of_deploy'], '')}")
    print(f"P3 ratio deploy/fetcher alone {fmt(p3['ratio_deploy_vs_fetcher'], '')}")
    print(against_target("P3 ratio deploy/curl   ", p3["ratio"], TARGET))
    print(f"P3 ratio whole run/curl {fmt(p3['ratio_whole_run'], '')}")
    print(against_target("P3b ratio deploy/hf download", p3b["ratio"], TARGET_B))
    write_result("P3", p3)
    write_result("P3b", p3b)
    return p3


if __name__ == "__main__":
    main()
