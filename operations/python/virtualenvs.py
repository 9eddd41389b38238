"""Isolated Python virtualenvs holding one pinned requirement each, built by uv.

uv (pinned, its wheel hash-locked in locks/uv==VERSION.txt) creates the virtualenvs and installs
into them: it resolves and links a wheel set in parallel, where pip runs ensurepip in every new
venv and installs file by file. It also provides Python 3.11 where the system's python3 is older
(Ubuntu 22.04's 3.10), from python-build-standalone, each build checked against the sha256 uv
carries. pip stays the fallback on a host whose machine has no uv wheel in the lock (anything but
x86_64 and aarch64): there `python3 -m venv` and pip build the venv.

A git requirement (``name @ git+URL@REF``) runs its build backend's code, which root must not run: the
build user (BUILD_USER, a system user without a login shell, the token, the keys or the weights) fetches
the commit and builds it into a wheel in its own home, which root never acts inside; root takes the
wheel from it on a pipe, into the virtualenv's own directory, and installs it (installing a wheel runs
none of its code), building none of its dependencies. Root never starts a virtualenv's own Python once
anything is installed in it (its site-packages' .pth files run at every start): it reads versions from
the files (VenvRequirement) and compiles bytecode with the interpreter the venv links to (``compiled``).
"""

import re
import shlex
from dataclasses import dataclass

from pyinfra import host
from pyinfra.api import FactBase, operation

from deployment.python.pinned import RELEASE, committed_lock, fingerprint
from deployment.server.config import BUILD_USER, git_refs, home_of
from operations.basics import gathering, ownership
from operations.basics.host_programs import inline

MARKER = ".specfleet-requirement"
LOCK = ".specfleet-requirements.lock"  # in the virtualenv: the hash lock it was installed from


UV_VERSION = "0.13.8"
UV_MACHINES = ("x86_64", "aarch64")  # the machines locks/uv==UV_VERSION.txt has a wheel for
MINIMUM_PYTHON = (3, 11)  # SGLang's
MANAGED_PYTHON = "3.11"  # what uv installs where the system python3 is older
# Where uv downloads Python builds from (its default); preflight checks the host reaches it.
PYTHON_SOURCE = "https://github.com/astral-sh/python-build-standalone/releases/download"
PYPI = "https://pypi.org/simple/"
BUILD_HOME = home_of(BUILD_USER)
BUILD_DIR = f"{BUILD_HOME}/build"  # the build user's own: its source, caches and the wheel
WHEEL_DIR = ".specfleet-wheel"  # in the virtualenv: the wheel root installed, taken from the build user
# The longest a wheel's copy from the build user may take: a FIFO it leaves there must not hang the deploy.
WHEEL_COPY_S = 600


@dataclass(frozen=True)
class Uv:
    """Where a host's uv lives, all root's: the binary, its cache (wheels unpacked once, hard-linked
    into every venv on the same disk) and the Pythons it installs."""

    install_dir: str

    @property
    def binary(self) -> str:
        return f"{self.install_dir}/bin/uv"

    @property
    def cache(self) -> str:
        return f"{self.install_dir}/uv-cache"

    @property
    def pythons(self) -> str:
        return f"{self.install_dir}/python"


def hash_lock(requirement: str) -> str | None:
    """What the installer installs `requirement` from with --require-hashes: a requirement that carries its own
    --hash (a mirror's pinned build without dependencies), else the release's committed lock."""
    return f"{requirement}\n" if " --hash=" in requirement else committed_lock(requirement)


def unchecked(requirement: str) -> str:
    """The warning for a requirement installed without any hash check, and the way to one."""
    if RELEASE.fullmatch(requirement):
        return (f"{requirement}: no hash lock (operations/python/locks/{requirement}.txt, or the site's "
                f"SITE/locks/), so no hash is checked: write one into your site with "
                f"`SPECFLEET_SITE=SITE python -m operations.python.locks.compile {requirement}`")
    if "git+" in requirement:
        return (f"{requirement}: a git build installs unchecked (pip and uv check no hash of a git checkout): "
                "build its wheel once and name that wheel with --hash=sha256:<its sha256>")
    return (f"{requirement}: installs unchecked (no committed lock, no --hash=): pin a release with a lock in "
            "operations/python/locks/, or name a wheel (URL or path) with --hash=sha256:<its sha256>")


class VenvRequirement(FactBase):
    """
    The version of `distribution` in the virtualenv and the fingerprint of the requirement it was built for,
    read from the files alone (host_scripts/python_state.py, on the system's python3): the virtualenv's own
    interpreter runs every ``.pth`` file of its site-packages as it starts, and what a git build's wheel holds
    is its pull request's to decide, so root never starts it.

    .. code:: python

        {"version": "0.5.23", "fingerprint": "3f2a9c0d1e4b5a6c"}
    """

    host_answer = "python_state.venv_requirement"

    @classmethod
    def host_arguments(cls, kwargs: dict) -> dict:
        return {**kwargs, "marker": MARKER}

    def command(self, path: str, distribution: str) -> str:
        return inline("python_state", path, distribution, MARKER)

    def process(self, output):
        version, marker = [*output, "", ""][:2]
        return {"version": version.strip() or None, "fingerprint": marker.strip() or None}


class VenvsUsed(FactBase):
    """
    The virtualenvs DIRECTORY/STEM* and, for each, whether a file matching `units` (shell patterns: unit
    files) names its Python (``VENV/bin/python ``, as an ExecStart starts it).

    .. code:: python

        {"/opt/specfleet/sglang-venv-3f2a9c0d1e4b5a6c": True, "/opt/specfleet/sglang-venv": False}
    """

    host_answer = "python_state.venvs_used"
    default = dict

    def command(self, directory: str, stem: str, units: tuple[str, ...]) -> str:
        q = shlex.quote
        return (f"for venv in {q(directory)}/{q(stem)}*; do if [ -d \"$venv\" ] && [ ! -L \"$venv\" ]; then "
                f"if cat -- {' '.join(units)} 2>/dev/null | grep -qF -- \"$venv/bin/python \"; "
                "then echo \"used $venv\"; else echo \"unused $venv\"; fi; fi; done")

    def process(self, output):
        return {path: used == "used" for used, _, path in (line.partition(" ") for line in output if line.strip())}


_PYTHON_PROBE = f"""import sys
version = "%d.%d.%d" % sys.version_info[:3]
if sys.version_info >= {MINIMUM_PYTHON}:
    print("python", version, "-")
    sys.exit()
import urllib.error, urllib.request
try:
    urllib.request.urlopen({PYTHON_SOURCE!r}, timeout=5)
    print("python", version, "reached")
except urllib.error.HTTPError:  # an answer, whatever its status: the source is reachable
    print("python", version, "reached")
except Exception:
    print("python", version, "unreachable")
"""


class HostPython(FactBase):
    """
    What builds a host's virtualenvs: its machine, its python3 and, where that is older than SGLang's
    minimum, whether uv's Python source answers; the version of the uv at ``uv``.

    .. code:: python

        {"machine": "x86_64", "python": "3.10.12", "python_source": "unreachable", "uv": "0.13.8"}
    """

    host_answer = "python_state.host_python"
    
    @classmethod
    def host_arguments(cls, kwargs: dict) -> dict:
        return {**kwargs, "minimum": list(MINIMUM_PYTHON), "source": PYTHON_SOURCE}

    def command(self, uv: str) -> str:
        return (f"echo machine $(uname -m); python3 -c {shlex.quote(_PYTHON_PROBE)} 2>/dev/null || echo python none -; "
                f"{shlex.quote(uv)} --version 2>/dev/null || echo uv none")

    @staticmethod
    def default() -> dict:
        return {"machine": None, "python": None, "python_source": None, "uv": None}  # nothing known

    def process(self, output):
        facts = self.default()
        for words in (line.split() for line in output):
            if words[:1] == ["machine"] and len(words) == 2:
                facts["machine"] = words[1]
            elif words[:1] == ["python"] and len(words) == 3:
                facts["python"] = None if words[1] == "none" else words[1]
                facts["python_source"] = None if words[2] == "-" else words[2]
            elif words[:1] == ["uv"] and len(words) >= 2:
                facts["uv"] = None if words[1] == "none" else words[1]
        return facts


def python_ok(version: str | None) -> bool:
    return version is not None and tuple(int(part) for part in version.split(".")[:2]) >= MINIMUM_PYTHON


def python_problems(host_name: str, facts: dict) -> list[str]:
    """Why a host cannot get a Python >= 3.11 for SGLang's virtualenv: none, or one sentence with the way out."""
    if python_ok(facts["python"]):
        return []
    found = f"found {facts['python'] or 'no python3'}"
    if facts["python"] is None:
        return [f"{host_name}: the deploy needs a python3 (any version: uv provides 3.11 where it is older), "
                f"{found}: install python3"]
    if facts["machine"] not in UV_MACHINES:
        return [f"{host_name}: SGLang needs Python 3.11 or newer, {found}, and the uv lock has no wheel for "
                f"{facts['machine']} to install one: install python3.11 with its venv module as python3"]
    if facts["python_source"] != "reached":
        return [f"{host_name}: SGLang needs Python 3.11 or newer, {found}; uv installs one from "
                f"{PYTHON_SOURCE}, which this host cannot reach: open that to the host, or install python3.11 "
                "with its venv module as python3"]
    return []


def git_source(requirement: str) -> tuple[str, str, str] | None:
    """(repository URL, ref, subdirectory or "") of a git requirement (``name @ git+URL@REF#subdirectory=DIR``),
    else None."""
    refs = git_refs(requirement)
    if not refs:
        return None
    url, ref = refs[0]
    subdirectory = re.search(r"#(?:\S*&)?subdirectory=([^&\s]+)", requirement)
    return url, ref, subdirectory.group(1) if subdirectory else ""


def build_user(requirements: list[str]) -> None:
    """The build user (a system user without a login shell: ``ownership.service_user``), where any of
    `requirements` is a git build: ``git_build`` runs as it."""
    if any(git_source(r) for r in requirements):
        ownership.service_user(name="Build user", user=BUILD_USER, home=BUILD_HOME)


# What of root's environment a build takes: the proxy, where the host reaches the network through one
# (passed by name, so that no credential in a proxy URL reaches a command line).
BUILD_PASSED_ENV = ("http_proxy", "https_proxy", "no_proxy", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY")


def as_build_user(script: str) -> str:
    """`script` run by the build user in a transient unit of its own, after the user has made its build
    directory: an environment of its own (nothing of root's but the proxy, git never prompting), its home
    read-only but for that directory, so that a build leaves nothing (a ``~/.gitconfig``, an SSH
    ``ProxyCommand``) a later build would run, and every process it started ended with it
    (KillMode=control-group: ``runuser`` alone leaves a build's background process running)."""
    settings = ("KillMode=control-group", "ProtectHome=read-only", f"ReadWritePaths={BUILD_DIR}", "PrivateTmp=yes",
                "NoNewPrivileges=yes")
    env = (f"HOME={BUILD_HOME}", "PATH=/usr/local/bin:/usr/bin:/bin", f"TMPDIR={BUILD_DIR}/tmp",
           f"XDG_CACHE_HOME={BUILD_DIR}/cache", "GIT_TERMINAL_PROMPT=0", *BUILD_PASSED_ENV)
    return (f"runuser -u {BUILD_USER} -- mkdir -p -m 700 {BUILD_DIR} && cd / && systemd-run --quiet --wait --pipe "
            f"--collect --service-type=exec --uid={BUILD_USER} "
            + " ".join(f"--property={setting}" for setting in settings) + " "
            + " ".join(f"--setenv={variable}" for variable in env) + f" -- sh -c {shlex.quote(script)}")


def git_build(requirement: str, path: str, index: str, uv: "Uv | None", install: str) -> list[str]:
    """
    The commands that build a git requirement into a wheel as the build user, in its build directory
    (emptied first: a build starts from nothing), copy the wheel into root's virtualenv at `path`
    (WHEEL_DIR/NAME.whl), and install that file, as the requirement's name and extras, with `install`
    (root's installer command, up to its requirement). The build user fetches the commit as pip does (a
    clone, then the ref itself where the clone lacks it: a pull request's head is on no branch) and builds
    with uv (``uv build``) or, without uv, the virtualenv's pip (``pip wheel``), on the virtualenv's Python.
    """
    url, ref, subdirectory = git_source(requirement)
    q = shlex.quote
    venv, source, wheels = q(path), f"{BUILD_DIR}/src", f"{BUILD_DIR}/wheels"
    if uv:
        build = (f"UV_CACHE_DIR={BUILD_DIR}/uv-cache {q(uv.binary)} build --quiet --no-config --wheel "
                 f"--no-python-downloads --python {venv}/bin/python {index}--out-dir {wheels}")
    else:
        build = f"{venv}/bin/pip wheel --quiet --disable-pip-version-check --no-cache-dir --no-deps {index}-w {wheels}"
    # The build directory is the unit's one writable path, so it is emptied, not removed.
    fetch = (f"chmod -R u+rwX {BUILD_DIR} && find {BUILD_DIR} -mindepth 1 -delete && mkdir -m 700 {BUILD_DIR}/tmp && "
             f"git clone --quiet --filter=blob:none --no-checkout -- {q(url)} {source} && cd {source} && "
             f"if git rev-parse --quiet --verify {q(ref + '^{commit}')} >/dev/null; then git checkout --quiet {q(ref)}; "
             f"else git fetch --quiet origin {q(ref)} && git checkout --quiet FETCH_HEAD; fi && "
             "git submodule --quiet update --init --recursive")
    built = f"{build} {q(f'{source}/{subdirectory}' if subdirectory else source)} && rm -rf {source}"
    # Root reads what the build left only as the build user (cat through runuser): a link there reaches
    # nothing root alone may read, a FIFO is given up after WHEEL_COPY_S; the name root writes is checked
    # to be a plain wheel's (one file, no path, no character a shell or a terminal acts on) and never printed;
    # `ls` leaves out the .gitignore uv build writes there.
    handed = (f"name=$(runuser -u {BUILD_USER} -- ls {wheels}) && case \"$name\" in "
              f"(*[!A-Za-z0-9._+-]*|.*|'') false;; (*.whl) true;; (*) false;; esac || "
              f"{{ echo 'the git build left no single wheel in {wheels}' >&2; exit 1; }}; "
              f"mkdir -m 700 {venv}/{WHEEL_DIR} && timeout {WHEEL_COPY_S} runuser -u {BUILD_USER} -- "
              f"cat -- {wheels}/\"$name\" > {venv}/{WHEEL_DIR}/\"$name\"")
    named = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*(?:\[[^\]]*\])?)\s*@", requirement)
    wheel = f"{q(named.group(1) + ' @ file://')}\"$1\"" if named else '"$1"'
    # The wheel's dependencies come from the index unchecked: root installs their wheels and builds none
    # (an sdist's build backend is its author's code).
    binary = "--no-build " if uv else "--only-binary :all: "
    return [as_build_user(f"{fetch} && {built}"), handed,
            f"set -- {venv}/{WHEEL_DIR}/*.whl && {install}{binary}{wheel}"]


def compiled(path: str) -> str:
    """The command compiling the virtualenv's modules to bytecode, as pip's install does in its own process
    (the venv is root's: the service user could not write the .pyc files, and every server start would
    compile torch's modules again). uv's --compile-bytecode starts the venv's own Python, which runs every
    .pth file just installed (uv 0.13.8, measured): root starts the interpreter the venv links to instead,
    isolated and without the site module (-I -S), which reads nothing of the venv but the files it
    compiles. compileall's status 1 (a file that does not compile) is left to that file's import, as pip
    and uv leave it."""
    venv = shlex.quote(path)
    return f'rc=0; "$(realpath {venv}/bin/python)" -I -S -m compileall -q -j 0 {venv}/lib || rc=$?; [ "$rc" -le 1 ]'


@operation()
def uv(uv: Uv, index_url: str | None = None):
    """
    Install the pinned uv (its wheel hash-checked against locks/uv==UV_VERSION.txt) at ``uv.binary``.

    + uv: where the host's uv lives
    + index_url: the package index holding uv's wheel (None: PyPI)

    **Example:**

    .. code:: python

        virtualenvs.uv(name="uv", uv=virtualenvs.Uv("/opt/specfleet"), index_url="http://mirror/simple/")
    """
    facts = gathering.read(HostPython, uv=uv.binary)
    if facts["machine"] not in UV_MACHINES:
        host.noop(f"no uv wheel for {facts['machine']}: virtualenvs are built with python3 -m venv and pip")
        return
    if facts["uv"] == UV_VERSION:
        host.noop(f"uv {UV_VERSION} is installed")
        return
    hashes = re.findall(r"--hash=sha256:([0-9a-f]{64})", committed_lock(f"uv=={UV_VERSION}"))
    yield inline("install_uv", index_url or PYPI, UV_VERSION, uv.binary, *hashes)


@operation()
def requirement(path: str, requirement: str, distribution: str, index_url: str | None = None,
                uv: Uv | None = None):
    """
    Build a virtualenv holding `requirement`, rebuilding it only when the requirement changes.

    + path: where the virtualenv lives
    + requirement: a pip requirement: a PyPI pin, ``name @ git+URL@ref``, a wheel path or URL; a release
      pin with a committed lock (``operations/python/locks/``), or a requirement carrying ``--hash=``, is installed
      with ``--require-hashes``
    + distribution: the distribution it installs, to read its version
    + index_url: a PyPI mirror or private index (None: PyPI)
    + uv: the host's uv (``virtualenvs.uv`` installs it), which builds the venv, on Python 3.11 of its own where
      the system's python3 is older; None, or a machine without a uv wheel: python3 -m venv and pip
    A git requirement is built into a wheel by BUILD_USER (``git_build``), which must exist
    (``ownership.service_user`` with BUILD_HOME), and root installs the wheel.

    **Example:**

    .. code:: python

        virtualenvs.requirement(
            name="Install SGLang",
            path="/opt/specfleet/sglang-venv",
            requirement="sglang==0.5.23",
            distribution="sglang",
            uv=virtualenvs.Uv("/opt/specfleet"),
        )
    """
    installed = gathering.read(VenvRequirement, path=path, distribution=distribution)
    wanted = fingerprint(requirement, index_url)
    if installed and installed["version"] and installed["fingerprint"] == wanted:
        host.noop(f"{distribution} {installed['version']} is installed from {requirement}")
        return
    venv = shlex.quote(path)
    index = f"--index-url {shlex.quote(index_url)} " if index_url else ""
    lock = hash_lock(requirement)
    if lock is None:
        host.log_styled(unchecked(requirement), fg="yellow")
    # Rebuilt whole: an installer cannot reliably move a git build back to a release, and a
    # half-updated environment must never serve.
    python = gathering.read(HostPython, uv=uv.binary) if uv else None
    if not python or python["machine"] not in UV_MACHINES:
        uv = None  # python3 -m venv and pip
    if uv:
        # The system's python3 where it is new enough, else a Python of uv's own (only-managed: never an
        # older system one); the cache is root's, on the venvs' disk, so files are hard-linked, not copied.
        interpreter = ("python3 --no-python-downloads" if python_ok(python["python"])
                       else f"{MANAGED_PYTHON} --python-preference only-managed")
        env = f"UV_CACHE_DIR={shlex.quote(uv.cache)} UV_PYTHON_INSTALL_DIR={shlex.quote(uv.pythons)} "
        # The cache starts empty at each build, as pip's --no-cache-dir: a wheel URL whose bytes changed
        # must not be served from an old copy (the index sends no validators).
        yield (f"rm -rf {venv} {shlex.quote(uv.cache)} && "
               f"{env}{shlex.quote(uv.binary)} venv --quiet --no-config --python {interpreter} {venv}")
        install = f"{env}{shlex.quote(uv.binary)} pip install --quiet --no-config --python {venv}/bin/python {index}"
    else:
        yield f"rm -rf {venv} && python3 -m venv {venv}"
        install = f"{venv}/bin/pip install --quiet --disable-pip-version-check --no-cache-dir {index}"
    if lock:
        # Every file the installer fetches must hash to a value in the lock; anything else is refused.
        yield f"printf %s {shlex.quote(lock)} > {venv}/{LOCK}"
        yield f"{install}--require-hashes -r {venv}/{LOCK}"
    elif git_source(requirement):
        yield from git_build(requirement, path, index, uv, install)
    else:
        yield f"{install}{shlex.quote(requirement)}"
    if uv:
        yield compiled(path)
    yield f"echo {wanted} > {venv}/{MARKER}"


@operation()
def unused_removed(directory: str, stem: str, units: tuple[str, ...], wanted: list[str]):
    """
    Remove the virtualenvs DIRECTORY/STEM* that `wanted` does not name and no unit file uses (``VenvsUsed``:
    a replica's unit, or the previous one kept for its rollback, whose restore is then a restart, not a
    rebuild), each said.

    + directory: where the virtualenvs lie (root's)
    + stem: the start of their names
    + units: shell patterns of the unit files whose ExecStart may start one's Python
    + wanted: the virtualenvs this run's deployments use

    **Example:**

    .. code:: python

        virtualenvs.unused_removed(name="SGLang builds no unit uses", directory="/opt/specfleet", stem="sglang-venv",
                            units=("/etc/systemd/system/sglang*.service*",), wanted=["/opt/specfleet/sglang-venv-3f2a9c0d1e4b5a6c"])
    """
    found = gathering.read(VenvsUsed, directory=directory, stem=stem, units=units) or {}
    unused = sorted(path for path, used in found.items() if not used and path not in wanted)
    if not unused:
        host.noop(f"every {stem}* is wanted or used by a unit ({len(found)})")
        return
    for path in unused:
        host.log_styled(f"{host.name}: removing {path} (no deployment wants it, no unit uses it)", fg="yellow")
    # Root's own directories under root's install directory (ownership.root_directories).
    yield "rm -rf -- " + " ".join(shlex.quote(path) for path in unused)
