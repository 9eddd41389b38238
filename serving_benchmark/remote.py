"""What the bench does on a host, below its jobs: a shell command, a request to a server on the host,
the run's directory (the service user's, in root's) and the results brought back from it."""

import json
import shlex
import tarfile
from pathlib import Path

from deployment.server.config import Server
from operations.basics import shell
from operations.basics.host_programs import inline
from operations.server.host_scripts.engine_answers import scrubbed

BENCH_UNIT = "specfleet-bench"
RUNS = f"/var/lib/{BENCH_UNIT}"  # root's: each run's directory in it is the service user's
ARCHIVE = f"{RUNS}/level.tar.gz"  # a level's results as the service user archived them, root's file
CLIENT_UNIT = f"{BENCH_UNIT}-client"  # the client of the level running (one at a time on a host)


def run(host, command: str) -> tuple[bool, str]:
    ok, output = shell.run(host, command)
    return ok, output.stdout


def as_user(user: str, command: str) -> str:
    """`command` run as `user`: what touches the client's directory (which that user can write) never runs as root."""
    return f"runuser -u {shlex.quote(user)} -- sh -c {shlex.quote(command)}"


def request(host, d: Server, path: str, method: str = "GET", key_file: str = "") -> str:
    """One request to replica `d`'s port on its host (host_scripts/server_request.py), its body or "" on an
    error: a bench unit takes no key; a deployed unit takes the key in `key_file`, read on the host (its API
    key, or on an admin-optional route such as /flush_cache its worker admin key)."""
    command = inline("server_request", str(d.port), path, method, d.engine.user,
                     *([key_file] if key_file else []))
    ok, out = run(host, command)
    return out if ok else ""


def run_directory(host, user: str, remote_root: str) -> None:
    """Root's directory, and in it the run's, which the service user owns (and the client writes in)."""
    run(host, f"install -d -o root -g root -m 0755 {RUNS} && "
              f"install -d -o {shlex.quote(user)} -g {shlex.quote(user)} -m 0700 {remote_root}")


def clean(host, user: str, remote_root: str) -> None:
    """Stop a client still running (its unit, every process in it) and remove the run's directory. The
    raw results are on the controller by now: the host keeps nothing of the run. What is in the run's
    directory is the service user's, and that user deletes it; root removes the emptied directory."""
    run(host, f"systemctl stop {CLIENT_UNIT} 2>/dev/null; "
              f"{as_user(user, f'find {remote_root} -mindepth 1 -delete')}; "
              f"rmdir {remote_root}; rm -f {ARCHIVE}")


def files_only(member: tarfile.TarInfo, path: str) -> tarfile.TarInfo | None:
    """tarfile's `data` filter, and then only directories and regular files: a link or a FIFO the
    service user left in a level's directory is not recreated on the controller."""
    return tarfile.data_filter(member, path) if member.isfile() or member.isdir() else None


def fetch(host, user: str, remote: str, local: Path) -> None:
    """Bring a level's directory back (one tarball) and unpack it under `local`.

    The service user archives its directory (reading only what it may read, links as links) to
    stdout, which root's shell writes to root's own file: root opens nothing in that user's directory."""
    local.mkdir(parents=True, exist_ok=True)
    tarball = local.with_suffix(".tar.gz")
    run(host, f"{as_user(user, f'tar -C {remote} -czf - .')} > {ARCHIVE}")
    shell.get_file(host, ARCHIVE, str(tarball))
    run(host, f"rm -f {ARCHIVE}")
    try:
        with tarfile.open(tarball) as archive:
            archive.extractall(local, filter=files_only)
    except (tarfile.TarError, OSError) as error:
        host.log_styled(f"the results of {remote} did not unpack: {error}", fg="red")
    tarball.unlink()


def server_info(answer: str) -> dict:
    """/server_info's answer as a dict, its secrets masked (the API keys, the launch command's --api-key:
    engine_answers.scrubbed); {} when it is not a JSON object."""
    try:
        info = json.loads(answer or "{}")
    except ValueError:
        return {}
    return scrubbed(info) if isinstance(info, dict) else {}
