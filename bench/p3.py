"""P3: a fresh download of the lab's benchmark repo through the deploy, against parallel curl.

The repo: lab/bench-2g-64 (2 GiB in 64 shards) as the deploy's target (its drafter
comes along, as in any deploy). Each round, on one host, in alternating order:
  deploy: the deploy's weights stage (bench/weights_deploy.py) into an emptied weights_dir;
          timed as the Weights operation's wall time (primary) and the whole run;
  curl:   the same files (target and drafter) from the same hub's resolve URLs, following
          the CDN redirect as huggingface_hub does, 8 at a time (xargs -P8, huggingface_hub's
          default max_workers), timed on the host;
  hf:     huggingface_hub's snapshot_download alone, run by hand on the host with the
          deploy's tools venv (diagnostic: the library's own cost vs the deploy's around it);
  raw:    the same with huggingface_hub.constants.DOWNLOAD_CHUNK_SIZE = None (diagnostic: the
          library copies every body through 10 MiB BytesIO chunks).
"""

import json
import os
import shlex

import lab
from bench import repos
from bench.common import deploy, fmt, log, operation_times, ratio_summary, summary, write_result
from lab import fleet
from lab.config import HUB_URL, TOKEN_GRANTED
from lab.repos import KIMI_DFLASH

SPEC = "pcie=2,b200=1"
TARGET = 1.25
REPO_ID, SHARDS = "lab/bench-2g-64", 64
WEIGHTS_DIR = "/srv/specfleet/bench/p3"
CURL_DIR = "/srv/specfleet/bench/p3-curl"
HF_DIR = "/srv/specfleet/bench/p3-hf"
TOOLS_PY = "/opt/specfleet/tools-venv/bin/python"


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


def hf_script(repo_ids: list[tuple[str, str]], dest: str, raw_chunks: bool = False) -> str:
    # raw_chunks: huggingface_hub re-chunks each body into DOWNLOAD_CHUNK_SIZE (10 MiB) pieces through
    # a BytesIO; None hands the socket's chunks straight to the file (a one-line change in a fetcher).
    patch = "import huggingface_hub.constants as c\nc.DOWNLOAD_CHUNK_SIZE = None\n" if raw_chunks else ""
    code = (patch + "import sys\nfrom huggingface_hub import snapshot_download\n"
            "for repo, rev in zip(sys.argv[1::3], sys.argv[2::3]):\n"
            "    snapshot_download(repo, revision=rev, local_dir=sys.argv[3 + sys.argv.index(repo) - 1])\n")
    args = " ".join(f"{shlex.quote(r)} {rev} {shlex.quote(dest + '/' + r.replace('/', '--'))}" for r, rev in repo_ids)
    return (f"rm -rf {shlex.quote(dest)} && HF_ENDPOINT={HUB_URL} HF_TOKEN={TOKEN_GRANTED} "
            f"HF_HUB_DISABLE_PROGRESS_BARS=1 {TOOLS_PY} -c {shlex.quote(code)} {args}")


def main(rounds: int = min(int(os.environ.get("BENCH_ROUNDS", "5")), 3)) -> dict:
    hosts = lab.up(SPEC, log=log)
    host = hosts[0]
    log(f"P3: converging deploy on {host.name} (service user, tools venv, host scripts)")
    deploy("--limit", host.name).check()
    commit = repos.ensure(REPO_ID, repos.GB2, SHARDS)
    override = repos.target_override("p3", REPO_ID, commit, WEIGHTS_DIR)
    drafter_sha, drafter_files = manifest_files(KIMI_DFLASH)
    _, target_files = manifest_files(REPO_ID)
    urls = ([(f"{HUB_URL}/{REPO_ID}/resolve/{commit}/{p}", p) for p in target_files]
            + [(f"{HUB_URL}/{KIMI_DFLASH}/resolve/{drafter_sha}/{p}", f"drafter-{p}") for p in drafter_files])
    total = sum(f["size"] for f in json.loads((repos.files_of(REPO_ID).parent / "manifest.json").read_text())["files"])
    log(f"P3: {REPO_ID} ({len(target_files)} files, {total} bytes) + drafter, on {host.name}")

    deploy_op, deploy_run, curl_s, hf_s, curl_cpu, hf_cpu, raw_s, raw_cpu = [], [], [], [], [], [], [], []
    for r in range(rounds):
        order = ["deploy", "curl", "hf", "raw"] if r % 2 == 0 else ["curl", "raw", "hf", "deploy"]
        for kind in order:
            if kind == "deploy":
                fleet.ssh(host, f"rm -rf {WEIGHTS_DIR}")
                run = deploy("--limit", host.name, group_data=override,
                             deploy_file="bench/weights_deploy.py").check()
                deploy_op.append(operation_times(run)["operations"]["Weights"])
                deploy_run.append(run.seconds)
            elif kind == "curl":
                curl_s.append(timed_on_host(host, curl_script(urls, CURL_DIR), cpu=curl_cpu))
            elif kind == "raw":
                raw_s.append(timed_on_host(host, hf_script([(REPO_ID, commit), (KIMI_DFLASH, drafter_sha)],
                                                           HF_DIR, raw_chunks=True), cpu=raw_cpu))
            else:
                hf_s.append(timed_on_host(host, hf_script([(REPO_ID, commit), (KIMI_DFLASH, drafter_sha)],
                                                          HF_DIR), cpu=hf_cpu))
        fleet.ssh(host, f"rm -rf {CURL_DIR} {HF_DIR}")
        log(f"P3 round {r + 1}/{rounds}: deploy {deploy_op[-1]:.2f}s (run {deploy_run[-1]:.2f}s), "
            f"curl -P8 {curl_s[-1]:.2f}s, snapshot_download {hf_s[-1]:.2f}s (raw chunks {raw_s[-1]:.2f}s)")
    fleet.ssh(host, f"rm -rf {WEIGHTS_DIR}")

    result = {
        "measure": "fresh download of a 2 GiB 64-shard repo (+ drafter) through the deploy / curl xargs -P8",
        "host": host.name, "target": f"<= {TARGET}", "rounds": rounds, "bytes": total,
        "deploy_weights_op_s": summary(deploy_op), "deploy_weights_run_s": summary(deploy_run),
        "curl_p8_s": summary(curl_s), "snapshot_download_s": summary(hf_s),
        "curl_cpu_s": summary(curl_cpu), "snapshot_download_cpu_s": summary(hf_cpu),
        "snapshot_download_raw_chunks_s": summary(raw_s), "snapshot_download_raw_chunks_cpu_s": summary(raw_cpu),
        "ratio_snapshot_download_raw_chunks_vs_curl": ratio_summary(raw_s, curl_s),
        "ratio": ratio_summary(deploy_op, curl_s),
        "ratio_whole_run": ratio_summary(deploy_run, curl_s),
        "ratio_snapshot_download_vs_curl": ratio_summary(hf_s, curl_s),
        "ratio_deploy_vs_snapshot_download": ratio_summary(deploy_op, hf_s),
        "curl_MBps": round(total / summary(curl_s)["median"] / 1e6, 1),
        "deploy_MBps": round(total / summary(deploy_op)["median"] / 1e6, 1),
    }
    result["met"] = result["ratio"]["median"] <= TARGET
    print(f"P3 deploy Weights op    {fmt(result['deploy_weights_op_s'])} ({result['deploy_MBps']} MB/s)")
    print(f"P3 deploy whole run     {fmt(result['deploy_weights_run_s'])}")
    print(f"P3 curl xargs -P8       {fmt(result['curl_p8_s'])} ({result['curl_MBps']} MB/s)")
    print(f"P3 snapshot_download    {fmt(result['snapshot_download_s'])}")
    print(f"P3 CPU on the host (user+sys): curl {fmt(result['curl_cpu_s'])}, "
          f"snapshot_download {fmt(result['snapshot_download_cpu_s'])}")
    print(f"P3 ratio deploy/curl    {fmt(result['ratio'], '')}  target <= {TARGET}: "
          f"{'MET' if result['met'] else 'MISSED'}")
    print(f"P3 ratio whole run/curl {fmt(result['ratio_whole_run'], '')}")
    print(f"P3 ratio snapshot_download/curl {fmt(result['ratio_snapshot_download_vs_curl'], '')}")
    print(f"P3 snapshot_download with DOWNLOAD_CHUNK_SIZE=None: {fmt(result['snapshot_download_raw_chunks_s'])}, "
          f"CPU {fmt(result['snapshot_download_raw_chunks_cpu_s'])}; /curl "
          f"{fmt(result['ratio_snapshot_download_raw_chunks_vs_curl'], '')}")
    write_result("P3", result)
    return result


if __name__ == "__main__":
    main()
