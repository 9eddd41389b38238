"""operations.venv: a release with a committed lock installs with --require-hashes (facts in, commands out)."""

import hashlib
import os
import platform
import pwd
import shlex
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import pytest

from lab.index import start_index
from operations.basics.host_programs import program
from operations.python import virtualenvs
from operations.python.virtualenvs import HostPython, VenvRequirement
from tests.unit import fakehost
from tests.unit.test_gpu_operations import FakeHost, run

VENV = "/opt/specfleet/tools-venv"


class WarnedHost(FakeHost):
    warnings: list[str] = []

    def log_styled(self, message, **styles):
        self.warnings.append(message)


def install(requirement: str, installed=None) -> list[str]:
    commands, _ = run(virtualenvs.requirement, {VenvRequirement: installed or {"version": None, "fingerprint": None}},
                      path=VENV, requirement=requirement, distribution="x", index_url="http://index/simple/")
    return commands


def test_a_release_with_a_committed_lock_installs_only_hashed_files():
    commands = install("huggingface_hub==2.4.0")
    lock = virtualenvs.committed_lock("huggingface_hub==2.4.0")
    assert "huggingface-hub==2.4.0 --hash=sha256:" in lock and "httpx2==2.16.2 --hash=sha256:" in lock
    assert commands[1].startswith("printf %s '# huggingface_hub==2.4.0") and commands[1].endswith(
        f"> {VENV}/.specfleet-requirements.lock")
    assert commands[2] == (f"{VENV}/bin/pip install --quiet --disable-pip-version-check --no-cache-dir "
                           f"--index-url http://index/simple/ --require-hashes -r {VENV}/.specfleet-requirements.lock")
    assert len(commands) == 4  # rebuild, lock, the one hash-checked install, marker


def test_a_requirement_carrying_its_hash_is_its_own_lock():
    pinned = "sglang==0.5.23+lab --hash=sha256:" + "a" * 64
    commands = install(pinned)
    assert commands[1] == f"printf %s '{pinned}\n' > {VENV}/.specfleet-requirements.lock"
    assert commands[2].endswith(f"--require-hashes -r {VENV}/.specfleet-requirements.lock")


def test_a_release_without_a_lock_installs_unchecked_and_says_so(monkeypatch):
    monkeypatch.setattr("tests.unit.test_gpu_operations.FakeHost", WarnedHost)
    commands = install("sglang==0.5.22")
    assert commands[1].endswith("--index-url http://index/simple/ sglang==0.5.22")
    assert any("sglang==0.5.22: no hash lock" in w for w in WarnedHost.warnings)


def test_every_release_the_shipped_defaults_install_has_its_committed_lock():
    """What the defaults install from a release pin (the gateway's smg, the bench's aiperf, each shipped
    profile's SGLang, uv) is hash-checked: no run of the defaults warns of a missing lock."""
    from serving_benchmark.client import CLIENT_REQUIREMENT
    from tests.unit.group_data import host_data
    data = host_data("gateway")
    releases = {data.gateway_requirement, CLIENT_REQUIREMENT, f"uv=={virtualenvs.UV_VERSION}",
                *(p["sglang"]["requirement"] for p in data.profiles.values())}
    releases = {r for r in releases if virtualenvs.RELEASE.fullmatch(r)}
    assert {"smg==1.13.0", "aiperf==0.13.0", "sglang==0.5.23"} <= releases
    assert {r for r in releases if virtualenvs.hash_lock(r) is None} == set()
    for r in releases:  # the release itself is locked at its version, with its wheels' hashes
        assert f"\n{r.split('==')[0].replace('_', '-')}=={r.split('==')[1]} --hash=sha256:" in \
            virtualenvs.hash_lock(r).replace("_", "-"), r


def test_a_sites_own_release_is_locked_from_its_site_directory(tmp_path, monkeypatch):
    """A site that pins a release of its own keeps its lock in SITE/locks/, never in the checkout."""
    monkeypatch.setenv("SPECFLEET_SITE", str(tmp_path))
    assert virtualenvs.committed_lock("smg==1.14.0") is None
    assert "SITE/locks/" in virtualenvs.unchecked("smg==1.14.0")
    (tmp_path / "locks").mkdir()
    (tmp_path / "locks" / "smg==1.14.0.txt").write_text("smg==1.14.0 --hash=sha256:" + "a" * 64 + "\n")
    assert virtualenvs.committed_lock("smg==1.14.0") == "smg==1.14.0 --hash=sha256:" + "a" * 64 + "\n"
    assert virtualenvs.committed_lock("smg==1.13.0").startswith("# smg==1.13.0")  # the checkout's first


def test_fingerprint_covers_the_lock_and_keeps_unlocked_ones():
    plain = hashlib.sha256(b"sglang==0.5.22|None").hexdigest()[:16]
    assert virtualenvs.fingerprint("sglang==0.5.22", None) == plain  # no lock: as before, no rebuild
    hub = virtualenvs.fingerprint("huggingface_hub==2.4.0", None)
    assert hub != hashlib.sha256(b"huggingface_hub==2.4.0|None").hexdigest()[:16]
    installed = {"version": "2.4.0", "fingerprint": virtualenvs.fingerprint("huggingface_hub==2.4.0", "http://index/simple/")}
    assert install("huggingface_hub==2.4.0", installed) == []  # built from this lock: nothing to do


UV = virtualenvs.Uv("/opt/specfleet")
UV_ENV = "UV_CACHE_DIR=/opt/specfleet/uv-cache UV_PYTHON_INSTALL_DIR=/opt/specfleet/python "
# HostPython on real hosts: Debian 12 (the lab), Ubuntu 22.04 without a route out, a POWER host.
DEBIAN12 = HostPython().process(["machine x86_64", "python 3.11.2 -", "uv 0.13.8 (x86_64-unknown-linux-gnu)"])
UBUNTU2204_OFFLINE = HostPython().process(["machine x86_64", "python 3.10.12 unreachable", "uv none"])
PPC64LE = HostPython().process(["machine ppc64le", "python 3.10.12 reached", "uv none"])


def install_with_uv(requirement: str, python: dict) -> list[str]:
    commands, _ = run(virtualenvs.requirement, {VenvRequirement: {"version": None, "fingerprint": None}, HostPython: python},
                      path=VENV, requirement=requirement, distribution="x", index_url="http://index/simple/", uv=UV)
    return commands


def test_host_python_fact_reads_machine_python_and_uv():
    assert DEBIAN12 == {"machine": "x86_64", "python": "3.11.2", "python_source": None, "uv": "0.13.8"}
    assert UBUNTU2204_OFFLINE == {"machine": "x86_64", "python": "3.10.12", "python_source": "unreachable", "uv": None}
    assert HostPython().process(["machine x86_64", "python none -", "uv none"])["python"] is None


def test_uv_builds_the_venv_on_the_system_python_and_installs_hash_checked():
    commands = install_with_uv("huggingface_hub==2.4.0", DEBIAN12)
    assert commands[0] == (f"rm -rf {VENV} /opt/specfleet/uv-cache && {UV_ENV}/opt/specfleet/bin/uv venv --quiet --no-config "
                           f"--python python3 --no-python-downloads {VENV}")
    assert commands[2] == (f"{UV_ENV}/opt/specfleet/bin/uv pip install --quiet --no-config "
                           f"--python {VENV}/bin/python "
                           f"--index-url http://index/simple/ --require-hashes -r {VENV}/.specfleet-requirements.lock")
    # Bytecode from the interpreter the venv links to, isolated and without site (no .pth file of the venv runs).
    assert commands[3] == (f'rc=0; "$(realpath {VENV}/bin/python)" -I -S -m compileall -q -j 0 {VENV}/lib '
                           '|| rc=$?; [ "$rc" -le 1 ]')
    assert len(commands) == 5


def test_root_never_starts_a_venvs_python_once_anything_is_installed_in_it():
    """Every .pth file of a venv's site-packages runs when its Python starts, and a git build's wheel is its
    pull request's: root's commands start the venv's Python only while it is empty (uv's install asks it its
    version), the fact reads the files on the system's python3, and uv's --compile-bytecode (which starts
    the venv's Python after installing) is never asked for."""
    for python in (DEBIAN12, {**PPC64LE, "python": "3.12.3"}):
        for requirement in ("huggingface_hub==2.4.0", GIT_BUILD, "x==1"):
            commands, _ = fakehost.run(virtualenvs.requirement, {VenvRequirement: {"version": None, "fingerprint": None},
                                                          HostPython: python},
                                       path=VENV, requirement=requirement, distribution="x", uv=UV)
            assert [c for c in commands if "--compile-bytecode" in c] == [], commands
    fact = VenvRequirement().command(path=VENV, distribution="sglang")
    assert fact.startswith("python3 -c ") and f"{VENV}/bin/python" not in fact and VENV in shlex.split(fact)


def test_uv_provides_python_311_where_the_system_one_is_older():
    reachable = {**UBUNTU2204_OFFLINE, "python_source": "reached"}
    [create, *_] = install_with_uv("huggingface_hub==2.4.0", reachable)
    assert "uv venv --quiet --no-config --python 3.11 --python-preference only-managed " in create
    assert "UV_PYTHON_INSTALL_DIR=/opt/specfleet/python " in create  # root's, under the install dir


def test_pip_is_the_fallback_where_the_lock_has_no_uv_wheel():
    commands = install_with_uv("huggingface_hub==2.4.0", {**PPC64LE, "python": "3.12.3"})
    assert commands[0] == f"rm -rf {VENV} && python3 -m venv {VENV}"
    assert commands[2].startswith(f"{VENV}/bin/pip install ") and "--require-hashes" in commands[2]


def test_a_python_older_than_311_is_refused_only_where_uv_cannot_provide_one():
    assert virtualenvs.python_problems("h", DEBIAN12) == []
    assert virtualenvs.python_problems("h", {**UBUNTU2204_OFFLINE, "python_source": "reached"}) == []
    [offline] = virtualenvs.python_problems("h", UBUNTU2204_OFFLINE)
    assert offline.startswith("h: SGLang needs Python 3.11 or newer, found 3.10.12; uv installs one from "
                              "https://github.com/astral-sh/python-build-standalone/releases/download, "
                              "which this host cannot reach")
    [power] = virtualenvs.python_problems("h", PPC64LE)
    assert "the uv lock has no wheel for ppc64le" in power
    [none] = virtualenvs.python_problems("h", HostPython().process(["machine x86_64", "python none -", "uv none"]))
    assert "found no python3: install python3" in none


def test_uv_is_installed_from_its_locked_wheels_and_left_alone_once_there():
    commands, _ = run(virtualenvs.uv, {HostPython: {**DEBIAN12, "uv": None}}, uv=UV, index_url="http://index/simple/")
    [command] = commands
    hashes = "e18a57b8b352eb7c8feb317b9f6f533c8f0ad9673fd6cf34bbe3cf1a9f6a8984 " \
             "0b3e8b1a4f5e405e31e2ff33de8af4744831e9f7338539671efbd8c3c94e791d"
    assert command.startswith("python3 -c ") and command.endswith(
        f" http://index/simple/ 0.13.8 /opt/specfleet/bin/uv {hashes}")
    assert run(virtualenvs.uv, {HostPython: DEBIAN12}, uv=UV)[0] == []
    commands, noops = run(virtualenvs.uv, {HostPython: PPC64LE}, uv=UV)
    assert commands == [] and noops == ["no uv wheel for ppc64le: virtualenvs are built with python3 -m venv and pip"]


def test_real_sglang_0_5_23_is_locked_with_its_cuda_13_torch():
    lock = virtualenvs.committed_lock("sglang==0.5.23")
    pins = dict(line.split(" ", 1)[0].split("==") for line in lock.splitlines() if not line.startswith("#"))
    assert pins["sglang"] == "0.5.23" and pins["torch"] == "2.14.1" and pins["nvidia-cublas"].startswith("13.")
    assert all("--hash=sha256:" in line for line in lock.splitlines() if not line.startswith("#"))
    assert len(lock) < 100_000  # it travels inside one command (MAX_ARG_STRLEN is 128 KiB)


def _fake_uv_wheel(directory, machine: str) -> str:
    """A wheel shaped as uv's (its binary under uv-VERSION.data/scripts/), served by the lab's index code."""
    wheels = directory / "wheels"
    wheels.mkdir()
    path = wheels / f"uv-{virtualenvs.UV_VERSION}-py3-none-manylinux_2_17_{machine}.manylinux2014_{machine}.whl"
    with zipfile.ZipFile(path, "w") as wheel:
        wheel.writestr(f"uv-{virtualenvs.UV_VERSION}.data/scripts/uv", "#!/bin/sh\necho uv stand-in\n")
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_install_uv_takes_only_a_wheel_whose_hash_the_lock_lists(tmp_path):
    digest = _fake_uv_wheel(tmp_path, platform.machine())
    index = start_index(tmp_path)
    dest = tmp_path / "bin" / "uv"
    try:
        def install(*hashes):
            return subprocess.run([sys.executable, "-c", program("install_uv"), index.url, virtualenvs.UV_VERSION, str(dest),
                                   *hashes], capture_output=True, text=True)
        refused = install("0" * 64)
        assert refused.returncode == 1 and "which the uv lock does not list: refused" in refused.stderr
        assert not dest.exists()
        assert install("0" * 64, digest).returncode == 0
        assert subprocess.run([str(dest)], capture_output=True, text=True).stdout == "uv stand-in\n"
    finally:
        index.stop()


@pytest.mark.parametrize("requirement, says", [
    ("sglang @ https://wheels.example/sglang-0.5.23-py3-none-any.whl", "installs unchecked (no committed lock, no --hash=)"),
    ("/srv/wheels/sglang-0.5.23-py3-none-any.whl", "installs unchecked (no committed lock, no --hash=)"),
    ("sglang @ git+https://github.com/sgl-project/sglang@" + "a" * 40 + "#subdirectory=python",
     "a git build installs unchecked (pip and uv check no hash of a git checkout)"),
    ("sglang>=0.5.23", "installs unchecked (no committed lock, no --hash=)"),
])
def test_a_url_path_git_or_range_requirement_installs_unchecked_and_says_so(monkeypatch, requirement, says):
    monkeypatch.setattr("tests.unit.test_gpu_operations.FakeHost", WarnedHost)
    WarnedHost.warnings = []
    commands = install(requirement)
    assert "--require-hashes" not in " ".join(commands)
    [warning] = WarnedHost.warnings
    assert warning.startswith(f"{requirement}: {says}"), warning
    if "git+" not in requirement:  # carrying its hash: installed with --require-hashes, nothing to say
        WarnedHost.warnings = []
        assert "--require-hashes" in install(f"{requirement} --hash=sha256:" + "b" * 64)[2]
        assert WarnedHost.warnings == []


GIT_BUILD = "sglang @ git+https://github.com/sgl-project/sglang@" + "a" * 40 + "#subdirectory=python"
BUILD_AS_USER = ("runuser -u specfleet-build -- mkdir -p -m 700 /home/specfleet-build/build && cd / && systemd-run "
                 "--quiet --wait --pipe --collect --service-type=exec --uid=specfleet-build ")


@pytest.mark.parametrize("python", [DEBIAN12, {**PPC64LE, "python": "3.12.3"}], ids=["uv", "pip"])
def test_a_git_requirement_is_built_by_the_build_user_and_root_installs_only_its_wheel(python):
    commands, _ = fakehost.run(virtualenvs.requirement, {VenvRequirement: {"version": None, "fingerprint": None},
                                                  HostPython: python},
                               path=VENV, requirement=GIT_BUILD, distribution="sglang",
                               index_url="http://index/simple/", uv=UV)
    create, build, handed, installed, *compiled, marker = commands
    assert len(compiled) == (1 if python is DEBIAN12 else 0)
    assert create.startswith(f"rm -rf {VENV}")
    # The clone, the checkout and the build backend's code run as the build user alone, in its own directory.
    assert build.startswith(BUILD_AS_USER) and build.count("runuser") == 1
    script = shlex.split(build)[-1]
    assert script.startswith("chmod -R u+rwX /home/specfleet-build/build && find /home/specfleet-build/build "
                             "-mindepth 1 -delete && mkdir -m 700 /home/specfleet-build/build/tmp ")
    assert "git clone --quiet --filter=blob:none --no-checkout -- https://github.com/sgl-project/sglang " \
           "/home/specfleet-build/build/src" in script
    assert f"git checkout --quiet {'a' * 40}" in script
    builder = ("/opt/specfleet/bin/uv build --quiet --no-config --wheel --no-python-downloads " if python is DEBIAN12
               else f"{VENV}/bin/pip wheel --quiet --disable-pip-version-check --no-cache-dir --no-deps ")
    assert builder in script and script.endswith(
        "/home/specfleet-build/build/src/python && rm -rf /home/specfleet-build/build/src")
    # Root reads the build's directory only through the build user, and writes the wheel into its own venv.
    assert handed.startswith("name=$(runuser -u specfleet-build -- ls /home/specfleet-build/build/wheels) && ")
    assert handed.endswith(f"timeout 600 runuser -u specfleet-build -- cat -- /home/specfleet-build/build/wheels/"
                           f'"$name" > {VENV}/.specfleet-wheel/"$name"')
    # Root's installer is given that wheel, never the git URL (which it would build itself).
    assert installed.startswith(f"set -- {VENV}/.specfleet-wheel/*.whl && ")
    # It builds nothing: a dependency's sdist would run its author's build backend as root.
    binary = "--no-build " if python is DEBIAN12 else "--only-binary :all: "
    assert installed.endswith(f"--index-url http://index/simple/ {binary}'sglang @ file://'\"$1\"")
    assert "git+" not in installed and "runuser" not in installed
    assert marker == f"echo {virtualenvs.fingerprint(GIT_BUILD, 'http://index/simple/')} > {VENV}/.specfleet-requirement"


def test_a_git_build_runs_in_a_unit_that_ends_its_processes_and_leaves_nothing_for_the_next_build():
    """A build's code could leave a process running or write the build user's dotfiles (a ~/.gitconfig's
    insteadOf, an SSH ProxyCommand) and so change every later build on the host, another deployment's and the
    gateway's too: it runs in a transient unit whose processes all end with it, its home read-only but for the
    build directory; of root's environment it takes only the proxy, by name (a proxy URL may carry
    credentials, which a command line would show)."""
    [build, _, _] = virtualenvs.git_build(GIT_BUILD, VENV, "", None, "true ")
    words = shlex.split(build)
    words = words[words.index("systemd-run"):]
    unit = words[:words.index("--")]
    assert "--uid=specfleet-build" in unit and "--wait" in unit and "--pipe" in unit
    properties = [w.removeprefix("--property=") for w in unit if w.startswith("--property=")]
    assert {"KillMode=control-group", "ProtectHome=read-only", "ReadWritePaths=/home/specfleet-build/build",
            "NoNewPrivileges=yes"} <= set(properties)
    passed = [w.removeprefix("--setenv=") for w in unit if w.startswith("--setenv=") and "=" not in w[9:]]
    assert set(passed) == {"http_proxy", "https_proxy", "no_proxy", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY"}
    assert "HOME=/home/specfleet-build" in [w.removeprefix("--setenv=") for w in unit]


def test_the_wheels_name_is_taken_only_when_it_is_one_plain_wheel(tmp_path):
    """The name check of the handed-over wheel, run by sh on names a hostile build could leave."""
    [_, handed, _] = virtualenvs.git_build(GIT_BUILD, str(tmp_path), "", None, "true ")
    check = handed.split("; mkdir")[0].replace("runuser -u specfleet-build -- ls /home/specfleet-build/build/wheels",
                                              'printf %s "$NAMES"')
    for names, taken in [("sglang-0.5.23-py3-none-any.whl", True), ("a.whl\nb.whl", False), ("", False),
                         ("../../etc/x.whl", False), (".hidden.whl", False), ("x.whl;reboot", False),
                         ("sglang.tar.gz", False), ("x\x1b[2J.whl", False)]:
        ran = subprocess.run(["sh", "-c", check], env={"NAMES": names}, capture_output=True, text=True)
        assert (ran.returncode == 0) is taken, names
        assert names not in ran.stderr or not names  # a refused name is never printed


BACKEND = '''import os, zipfile

# Every start of a Python whose site-packages holds the wheel leaves a file naming its uid in STARTS.
PTH_LINE = "import os; open(os.path.join(STARTS, 'uid-%d-pid-%d' % (os.getuid(), os.getpid())), 'w').close()\\n"


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    """A wheel whose module records who built it, and whose .pth records who starts its Python."""
    name, info = "uidprobe-1.0-py3-none-any.whl", "uidprobe-1.0.dist-info"
    with zipfile.ZipFile(os.path.join(wheel_directory, name), "w") as wheel:
        wheel.writestr("uidprobe.py", f"BUILT_BY_UID = {os.getuid()}\\n")
        wheel.writestr("uidprobe_starts.pth", PTH_LINE)
        wheel.writestr(f"{info}/METADATA", "Metadata-Version: 2.1\\nName: uidprobe\\nVersion: 1.0\\n")
        wheel.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\\nGenerator: t\\nRoot-Is-Purelib: true\\nTag: py3-none-any\\n")
        wheel.writestr(f"{info}/RECORD", "")
    return name
'''


def as_runuser(command: str) -> str:
    """The build's transient unit as this machine can run it (systemd is not its init): the same user, script
    and environment, through runuser; what the unit adds (its processes ended, its home read-only) is
    systemd's, asserted on the command line above."""
    if " systemd-run " not in command:
        return command
    words = shlex.split(command[command.index("systemd-run "):])
    user = next(w.removeprefix("--uid=") for w in words if w.startswith("--uid="))
    env = [w.removeprefix("--setenv=") for w in words[:words.index("--")] if w.startswith("--setenv=") and "=" in w[9:]]
    return (command[:command.index("systemd-run ")] + f"runuser -u {user} -- env -i "
            + " ".join(shlex.quote(e) for e in env) + " " + " ".join(shlex.quote(w) for w in words[words.index("--") + 1:]))


@pytest.mark.skipif(os.geteuid() != 0 or not Path("/usr/bin/git").exists() or not Path("/usr/bin/python3").exists(),
                    reason="runs runuser as root, the system's git and python3")
def test_the_git_build_commands_build_as_another_user_and_root_installs_the_wheel():
    """The commands `requirement` yields for a git requirement, run for real with `nobody` as the build user
    (the only change: its name and home): a pull request's commit on no branch is fetched, its build backend
    runs as that user, and root's venv gets the wheel."""
    base = Path(tempfile.mkdtemp(prefix="specfleet-git-build-"))
    try:
        base.chmod(0o755)
        source = base / "pkg"
        source.mkdir()
        (source / "pyproject.toml").write_text('[build-system]\nrequires = []\nbuild-backend = "backend"\n'
                                               'backend-path = ["."]\n')
        starts = base / "starts"
        starts.mkdir(mode=0o777)
        starts.chmod(0o1777)
        (source / "backend.py").write_text(BACKEND.replace("STARTS", repr(str(starts))))
        git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(source)]
        subprocess.run([*git, "init", "-q", "-b", "main"], check=True)
        subprocess.run([*git, "commit", "-q", "--allow-empty", "-m", "base"], check=True)
        subprocess.run([*git, "checkout", "-q", "--detach"], check=True)
        subprocess.run([*git, "add", "."], check=True)
        subprocess.run([*git, "commit", "-q", "-m", "the pull request"], check=True)
        commit = subprocess.run([*git, "rev-parse", "HEAD"], check=True, capture_output=True, text=True).stdout.strip()
        bare = base / "pkg.git"
        subprocess.run(["git", "clone", "-q", "--bare", str(source), str(bare)], check=True)
        subprocess.run(["git", "-C", str(bare), "update-ref", "refs/pull/1/head", commit], check=True)
        (base / "home").mkdir(mode=0o755)
        subprocess.run(["chown", "-R", "nobody:", str(bare), str(base / "home")], check=True)
        (base / "opt" / "bin").mkdir(parents=True)
        (base / "opt").chmod(0o755)
        (base / "opt" / "bin").chmod(0o755)
        # A copy, not a link: the checkout's venv may lie in a directory the build user cannot enter (mktemp -d).
        shutil.copy(Path(sys.executable).parent / "uv", base / "opt" / "bin" / "uv")
        path = f"{base}/opt/v"
        commands, _ = fakehost.run(virtualenvs.requirement, {VenvRequirement: None, HostPython: DEBIAN12}, path=path,
                                   requirement=f"uidprobe @ git+file://{bare}@{commit}", distribution="uidprobe",
                                   uv=virtualenvs.Uv(f"{base}/opt"))
        for command in commands:
            command = command.replace("specfleet-build", "nobody").replace("/home/nobody", f"{base}/home")
            command = as_runuser(command)
            # As on a host: root's umask 022 and the system's python3 (the venv is other users' to read).
            ran = subprocess.run(["sh", "-c", f"umask 022 && {command}"], capture_output=True, text=True,
                                 env={**os.environ, "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"})
            assert ran.returncode == 0, (command, ran.stderr)
        # The deploy reads what the venv holds as root: from its files, no Python of the venv started.
        fact = VenvRequirement()
        read = subprocess.run(["sh", "-c", fact.command(path=path, distribution="uidprobe")], capture_output=True,
                              text=True, check=True).stdout.splitlines()
        facts = fact.process(read)
        assert facts == {"version": "1.0", "fingerprint": virtualenvs.fingerprint(f"uidprobe @ git+file://{bare}@{commit}", None)}
        assert [p.name for p in starts.iterdir() if p.name.startswith("uid-0-")] == []
        built_by = subprocess.run(["runuser", "-u", "nobody", "--", f"{path}/bin/python", "-c",
                                   "import uidprobe; print(uidprobe.BUILT_BY_UID)"],
                                  capture_output=True, text=True, check=True).stdout.strip()
        nobody = pwd.getpwnam("nobody").pw_uid
        assert int(built_by) == nobody != 0
        assert {p.name.split("-pid-")[0] for p in starts.iterdir()} == {f"uid-{nobody}"}  # the .pth does run
        [wheel] = (Path(path) / virtualenvs.WHEEL_DIR).iterdir()
        assert wheel.name == "uidprobe-1.0-py3-none-any.whl" and wheel.stat().st_uid == 0
        assert not (base / "home" / "build" / "src").exists()  # the build user removed its checkout
    finally:
        shutil.rmtree(base)


def test_builds_no_deployment_wants_and_no_unit_uses_are_removed_after_the_units_moved():
    """One virtualenv per build: those a unit file names (a replica's, or its rollback's) stay, so that going
    back to the build before is a restart; the rest no deployment wants are removed, each said."""
    used = {"/opt/specfleet/sglang-venv-new": True, "/opt/specfleet/sglang-venv-before": True,
            "/opt/specfleet/sglang-venv-older": False, "/opt/specfleet/sglang-venv": False,
            "/opt/specfleet/sglang-venv-built": False}
    arguments = dict(directory="/opt/specfleet", stem="sglang-venv", units=("/etc/systemd/system/sglang*.service*",),
                     wanted=["/opt/specfleet/sglang-venv-new", "/opt/specfleet/sglang-venv-built"])
    commands, host = fakehost.run_host(virtualenvs.unused_removed, {virtualenvs.VenvsUsed: used}, **arguments)
    assert commands == ["rm -rf -- /opt/specfleet/sglang-venv /opt/specfleet/sglang-venv-older"]
    assert host.logged == [f"host-1: removing /opt/specfleet/{name} (no deployment wants it, no unit uses it)"
                           for name in ("sglang-venv", "sglang-venv-older")]
    commands, noops = fakehost.run(virtualenvs.unused_removed, {virtualenvs.VenvsUsed: {"/opt/specfleet/sglang-venv-new": True}},
                                   **arguments)
    assert commands == [] and noops == ["every sglang-venv* is wanted or used by a unit (1)"]
