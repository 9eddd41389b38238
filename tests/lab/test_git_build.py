"""A git build of SGLang deployed on lab-b200-1: the build user builds it, and root never starts its venv's Python.

The lab's hosts have no git and the lab's mirrors replace the DDTree pull request by a wheel, so this module
puts this machine's git on the host (Debian 12's, as the hosts': it links libc, zlib and pcre2 alone) and a
repository standing in for SGLang's on the host's disk, at a commit whose in-tree build backend makes the
release stand-in's wheel with a `.pth` added: every start of a Python whose site-packages holds it leaves a
file naming its uid. Both are removed after the module, and the host deployed as the shared lab has it.
"""

import base64
import subprocess

import pytest

from lab import fleet
from lab.index import standin_wheel_bytes
from deployment.hosts import resolve
from tests.helpers import run_deploy, write_group_data
from tests.unit.group_data import host_data

pytestmark = pytest.mark.lab

REPO = "/srv/lab-git/sglang.git"
STARTS = "/run/specfleet-starts"  # where the wheel's .pth leaves a file per interpreter start (mode 1777)
# A .pth line runs when it starts with `import`; a unit that cannot write STARTS must still start.
PTH_LINE = ("import os; exec(\"try: open(os.path.join(%r, 'uid-%%d-pid-%%d' %% (os.getuid(), os.getpid())), 'w').close()"
            "\\nexcept OSError: pass\")\n" % STARTS)
# The pull request's build backend: the stand-in's wheel as the lab index serves it, with the .pth added.
BACKEND = '''import base64, os, shutil, zipfile

def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    name = "sglang-0.5.23+lab-py3-none-any.whl"
    shutil.copy("standin.whl", os.path.join(wheel_directory, name))
    with zipfile.ZipFile(os.path.join(wheel_directory, name), "a") as wheel:
        wheel.writestr("sglang_starts.pth", base64.b64decode(PTH))
    return name
'''
PYPROJECT = '[build-system]\nrequires = []\nbuild-backend = "backend"\nbackend-path = ["."]\n'


def git(*args: str, cwd) -> str:
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=cwd, check=True,
                          capture_output=True, text=True).stdout.strip()


@pytest.fixture(scope="module")
def git_source(deployed_lab, b200_host, tmp_path_factory):
    """This machine's git on the host and the repository at REPO; the commit of its pull request."""
    host = b200_host
    source = tmp_path_factory.mktemp("sglang-source")
    (source / "pyproject.toml").write_text(PYPROJECT)
    (source / "backend.py").write_text(BACKEND.replace("PTH", repr(base64.b64encode(PTH_LINE.encode()).decode())))
    (source / "standin.whl").write_bytes(standin_wheel_bytes("0.5.23+lab"))
    git("init", "-q", "-b", "main", cwd=source)
    git("add", ".", cwd=source)
    git("commit", "-q", "-m", "the pull request", cwd=source)
    commit = git("rev-parse", "HEAD", cwd=source)
    tools = subprocess.run(["tar", "-C", "/", "-cz", "usr/bin/git", "usr/lib/git-core", "usr/share/git-core"],
                           check=True, capture_output=True).stdout
    bare = source.parent / "sglang.git"
    git("clone", "-q", "--bare", str(source), str(bare), cwd=source.parent)
    repo = subprocess.run(["tar", "-C", str(bare), "-cz", "."], check=True, capture_output=True).stdout
    for data, into in ((tools, "/"), (repo, REPO)):
        subprocess.run(fleet.ssh_command(host, f"mkdir -p {into} && tar -C {into} -xz"), input=data, check=True,
                       capture_output=True)
    # The repository is root's: a site's checkout would be the build user's to read, named safe for it.
    fleet.ssh(host, f"git config --system safe.directory {REPO} && install -d -m 1777 {STARTS}")
    try:
        yield commit
    finally:
        fleet.ssh(host, f"rm -rf /usr/bin/git /usr/lib/git-core /usr/share/git-core /etc/gitconfig /srv/lab-git {STARTS}")
        restored = run_deploy("--limit", host.name)
        assert restored.returncode == 0, restored.output[-3000:]


def test_root_never_starts_the_python_of_a_git_builds_venv(git_source, b200_host, tmp_path):
    """The deploy builds the pull request as the build user, installs its wheel, reads what it installed
    and restarts the server on it: no Python of that venv starts as root (its .pth would run as root),
    while the service user's starts do run the .pth."""
    host = b200_host
    requirement = f"sglang @ git+file://{REPO}@{git_source}"
    data = write_group_data(tmp_path, "lab", "mirrors = copy.deepcopy(base['mirrors'])\n"
                                             f"mirrors['requirements']['sglang==0.5.23'] = {requirement!r}")
    deployed = run_deploy("--limit", host.name, group_data=data)
    assert deployed.returncode == 0, deployed.output[-3000:]
    d = resolve(host_data("b200_nvlink", lab=True), "b200_nvlink")
    # The virtualenv the replica's unit starts its Python from: the git build's.
    started = fleet.ssh(host, f"systemctl show -p ExecStart --value {d.replicas[0].service_name}")
    venv = started.split("path=")[1].split("/bin/python")[0]
    site = fleet.ssh(host, f"ls -d {venv}/lib/python3*/site-packages").strip()
    assert fleet.ssh(host, f"cat {site}/sglang_starts.pth").strip() == PTH_LINE.strip()  # the wheel the build made
    started = fleet.ssh(host, f"ls {STARTS}").split()
    assert [name for name in started if name.startswith("uid-0-")] == [], started
    # The control: a start by the service user runs the .pth.
    fleet.ssh(host, f"runuser -u {d.engine.user} -- {venv}/bin/python -c pass")
    uid = fleet.ssh(host, f"id -u {d.engine.user}").strip()
    assert any(name.startswith(f"uid-{uid}-") for name in fleet.ssh(host, f"ls {STARTS}").split())
    again = run_deploy("--limit", host.name, group_data=data)
    assert again.returncode == 0, again.output[-3000:]
    started = fleet.ssh(host, f"ls {STARTS}").split()
    assert [name for name in started if name.startswith("uid-0-")] == [], started
