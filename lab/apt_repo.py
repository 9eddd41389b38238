"""The lab's NVIDIA apt repository: LAB STAND-INS for NVIDIA's driver packages, in a real,
signed apt repository laid out like NVIDIA's CUDA repository.

    python -m lab.apt_repo build --out DIR     (idempotent; rebuilt when its inputs change)

DIR/compute/cuda/repos/<os release>/x86_64/ is a flat repository like
https://developer.download.nvidia.com/compute/cuda/repos/debian12/x86_64/: .debs built
with dpkg-deb, Packages and Release from apt-ftparchive, InRelease and Release.gpg signed
with the lab's own key (made once per lab with gpg). The lab's `cuda-keyring` package
installs that key and the source line, as NVIDIA's installs NVIDIA's; the services serve
DIR over plain HTTP (lab.services).

Every package here is a stand-in holding no NVIDIA software, labelled in its description.
Names, versions and dependency shapes are NVIDIA's, per OS release (`release_debs`):
- Debian (debian12, debian13): Debian's names, which never carry the branch (`nvidia-open`,
  `nvidia-kernel-open-dkms`, `nvidia-smi`, `libnvidia-ml1`, `nvidia-persistenced`), revision `-1`,
  a branch chosen by `nvidia-driver-pinning-<branch>` on every branch;
- Ubuntu (ubuntu2204, ubuntu2404): before 590 every part carries its branch (`nvidia-open-580`,
  `nvidia-dkms-580-open`, `nvidia-utils-580`, ...); from 590 on the same parts without it
  (`nvidia-open`, `nvidia-dkms-open`, ...) behind `nvidia-driver-pinning-<branch>`; revisions
  `-0ubuntu1` or `-1ubuntu1` by build;
- `nvidia-fabricmanager` at each exact driver version (providing `nvidia-fabricmanager-<branch>`),
  revision `-1`, or `-1ubuntu1` on Ubuntu from 590 on; `nvlsm`.
The lab boots Debian hosts only: the Ubuntu repositories are built and checked by unit tests
(tests/unit/test_lab_apt_repo.py), never installed from.
Their content is the GPU stand-in's (lab/gpu_standin and lab/host_files), so installing them is
how nvidia-smi and the driver's units reach a host. The stand-in kernel module is "built" by the
dkms package's postinst (which, like DKMS, fails without the running kernel's headers) and
"loaded" only at boot by the lab's GPU unit (lab/host_files/usr/lib/specfleet-lab/apply-gpu-profile).

DIR/debian/ is the lab hosts' Debian mirror (they reach no other): Debian's REAL packages that the
deploy installs from Debian (DEBIAN_PACKAGES: Prometheus on gateway hosts, nginx for the weights'
fan-out) with every dependency,
downloaded once on the controller by its own apt from deb.debian.org, which checks Debian's signed
InRelease against Debian's archive keyring and each .deb against the signed index's SHA256, and
cached in DEBIAN_CACHE. They are served as a `dists/<suite>/main` archive signed with the lab's key,
the source every lab host's /etc/apt/sources.list names (debian_source, at boot).
"""

import argparse
import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from lab import rootfs
from lab.config import APT_URL, DEBIAN_URL

LAB = Path(__file__).resolve().parent
# NVIDIA's repository directory for each OS release, and how NVIDIA names and versions packages there.
OS_RELEASES = {"debian12": "debian", "debian13": "debian", "ubuntu2204": "ubuntu", "ubuntu2404": "ubuntu"}
ARCH = "x86_64"
DEB_ARCH = "amd64"
# Driver versions the repository holds: two 580 releases (fabric manager pinned to the older
# one is the version-mismatch case), the 590 branch (upgrade), 595 (the PCIe profile's image).
# NVIDIA's debian13 repository has carried no 580 driver (NVIDIA/cuda-repo-management#38, #40);
# the lab's keeps it, so a trixie host gets the class's default branch.
DRIVER_VERSIONS = ["580.82.07", "580.95.05", "590.48.01", "595.58.03"]
# The CUDA version each branch's driver supports, as nvidia-smi reports it.
CUDA = {580: "13.0", 590: "13.1", 595: "13.2"}
# Ubuntu revisions of these drivers in NVIDIA's ubuntu2404 repository: 580 up to 580.105.08 and
# 590.48.01 carry -0ubuntu1, 580.126.09 on and 595 -1ubuntu1 (its Packages listings as published).
UBUNTU_DRIVER_REVISIONS = {"580.82.07": "0ubuntu1", "580.95.05": "0ubuntu1", "590.48.01": "0ubuntu1",
                           "595.58.03": "1ubuntu1"}
# Fabric manager on Ubuntu: -1 for 580 builds (nvidia-fabricmanager_580.95.05-1_amd64.deb in
# ubuntu2404), -1ubuntu1 for later ones (580.173.02-1ubuntu1, 615.71.09-1ubuntu1): here from 590 on.
UBUNTU_FABRIC_REVISION_FROM = 590
# NVIDIA's Ubuntu packages lose the branch from their names from this branch on ("Recent Updates").
UNSUFFIXED_FROM = 590
NVLSM_VERSION = "2025.06.1-1"
KEYRING_VERSION = "1.1-1"
# The running kernel is the controller's: nspawn containers share it.
KERNEL_RELEASE = os.uname().release
MODULE_PATH = "lib/modules/$(uname -r)/updates/dkms/nvidia.ko"
LABEL = "specfleet lab STAND-IN, no NVIDIA software"
# The pinning packages' apt preferences file: one name for every branch, so one pin at a time.
PIN_FILE = "etc/apt/preferences.d/nvidia-driver-pin"


@dataclass(frozen=True)
class Deb:
    """One package of the repository: its control fields, files {path: (bytes, mode; 0: a symlink to
    the bytes)} and maintainer scripts."""

    name: str
    version: str
    description: str
    depends: tuple[str, ...] = ()
    provides: tuple[str, ...] = ()
    conflicts: tuple[str, ...] = ()
    replaces: tuple[str, ...] = ()
    files: dict = field(default_factory=dict)
    scripts: dict = field(default_factory=dict)
    arch: str = DEB_ARCH


# What the deploy installs from Debian's archive (Prometheus on gateway hosts, operations/monitoring;
# nginx for the weights' fan-out, operations/weights/peer.py), resolved by apt as a host with nothing
# installed would (so the closure holds whatever a host lacks), without Recommends, as the deploy
# installs it.
DEBIAN_PACKAGES = ["prometheus", "nginx"]
# Bookworm only: trixie hosts (`lab up --os trixie`) are GPU hosts, which install nothing from Debian
# unless the weights' fan-out is on (lab/group_data/lab.py keeps it off).
DEBIAN_SUITES = [rootfs.DEFAULT_SUITE]
DEBIAN_CACHE = Path("/var/cache/specfleet/debian")
DEBIAN_KEYRING = "usr/share/keyrings/specfleet-lab-archive.gpg"  # on a lab host


def repo_dir(out: Path, os_release: str) -> Path:
    return out / "compute/cuda/repos" / os_release / ARCH


def _branch(version: str) -> int:
    return int(version.split(".")[0])


def _write_deb(pool: Path, deb: Deb) -> None:
    """Build one .deb with dpkg-deb."""
    with tempfile.TemporaryDirectory() as tmp:
        tree = Path(tmp)
        tree.chmod(0o755)  # the package's "./": dpkg-deb records its mode
        (tree / "DEBIAN").mkdir()
        control = [f"Package: {deb.name}", f"Version: {deb.version}", f"Architecture: {deb.arch}",
                   "Maintainer: specfleet lab <lab@specfleet.invalid>", "Section: lab", "Priority: optional"]
        for label, values in (("Depends", deb.depends), ("Provides", deb.provides), ("Conflicts", deb.conflicts),
                              ("Replaces", deb.replaces)):
            if values:
                control.append(f"{label}: " + ", ".join(values))
        control.append(f"Description: {deb.description} ({LABEL})")
        (tree / "DEBIAN/control").write_text("\n".join(control) + "\n")
        for script, body in deb.scripts.items():
            path = tree / "DEBIAN" / script
            path.write_text("#!/bin/sh\nset -e\n" + body)
            path.chmod(0o755)
        for path, (content, mode) in deb.files.items():
            target = tree / path
            target.parent.mkdir(parents=True, exist_ok=True)
            if mode == 0:  # a symlink to `content`
                target.symlink_to(content.decode())
            else:
                target.write_bytes(content)
                target.chmod(mode)
        subprocess.run(["dpkg-deb", "--root-owner-group", "-Zgzip", "--build", str(tree),
                        str(pool / f"{deb.name}_{deb.version}_{deb.arch}.deb")], check=True, stdout=subprocess.DEVNULL)


def part_names(family: str, branch: int) -> dict[str, str]:
    """The driver's parts by role, as NVIDIA names them for `family` ("debian" or "ubuntu") and `branch`.

    Debian: Debian's names on every branch. Ubuntu before 590: every part carries its branch (apt only
    installs candidate versions of dependencies, so a branch needs names of its own); from 590 on the
    same names without it (NVIDIA's renames table: nvidia-dkms-580-open -> nvidia-dkms-open,
    libnvidia-compute-580 -> libnvidia-compute; nvidia-utils and nvidia-compute-utils by the same rule)."""
    if family == "debian":
        return dict(module="nvidia-kernel-open-dkms", smi="nvidia-smi", persistenced="nvidia-persistenced",
                    nvml="libnvidia-ml1", meta="nvidia-open")
    suffix = f"-{branch}" if branch < UNSUFFIXED_FROM else ""
    return dict(module=f"nvidia-dkms{suffix}-open", smi=f"nvidia-utils{suffix}",
                persistenced=f"nvidia-compute-utils{suffix}", nvml=f"libnvidia-compute{suffix}",
                meta=f"nvidia-open{suffix}")


def pinned(family: str, branch: int) -> bool:
    """Whether a pinning package chooses the branch (the metapackage's name does not)."""
    return family == "debian" or branch >= UNSUFFIXED_FROM


def driver_version(family: str, driver: str) -> str:
    return f"{driver}-{'1' if family == 'debian' else UBUNTU_DRIVER_REVISIONS[driver]}"


def fabric_version(family: str, driver: str) -> str:
    ubuntu_late = family == "ubuntu" and _branch(driver) >= UBUNTU_FABRIC_REVISION_FROM
    return f"{driver}-{'1ubuntu1' if ubuntu_late else '1'}"


def pinning_version(family: str, branch: int) -> str:
    """debian12 carries nvidia-driver-pinning-580 at 580-1 and 580-5; ubuntu2404 610-2ubuntu1."""
    return f"{branch}-1" if family == "debian" else f"{branch}-1ubuntu1"


def _driver_debs(family: str, driver: str) -> list[Deb]:
    version, branch = driver_version(family, driver), _branch(driver)
    names = part_names(family, branch)
    exact = lambda role: f"{names[role]} (= {version})"  # noqa: E731 (one-line helper)
    # Parts of the other branches that hold the same files: an upgrade replaces them.
    others = lambda role: tuple(n for b in sorted({_branch(d) for d in DRIVER_VERSIONS} - {branch})  # noqa: E731
                                if (n := part_names(family, b)[role]) != names[role])
    replaces = lambda role: dict(conflicts=others(role), replaces=others(role))  # noqa: E731
    smi = (LAB / "gpu_standin/nvidia-smi").read_bytes()
    persistenced = (LAB / "host_files/usr/lib/systemd/system/nvidia-persistenced.service").read_bytes()
    fabricmanager = (LAB / "vendor_units/nvidia-fabricmanager.service").read_bytes()
    lib = "usr/lib/x86_64-linux-gnu"
    nv_fabricmanager = (f"#!/bin/sh\n# {LABEL}: stands in for nv-fabricmanager {driver}.\n"
                        f'case "$1" in -v|--version) echo "Fabric Manager version is : {driver}"; exit 0;; esac\n'
                        'exec /usr/lib/specfleet-lab/driver-daemon-standin nvidia-fabricmanager "$@"\n')
    return [
        Deb(names["nvml"], version, f"NVIDIA Management Library {driver}", **replaces("nvml"), files={
            f"{lib}/libnvidia-ml.so.{driver}": (f"{LABEL}: NVML {driver}\n".encode(), 0o644),
            f"{lib}/libnvidia-ml.so.1": (f"libnvidia-ml.so.{driver}".encode(), 0),
            # The library's version as the nvidia-smi stand-in reads it (its docstring: NVML_VERSION_FILE).
            "usr/lib/specfleet-lab/nvml-version": (f"{driver} {CUDA[branch]}\n".encode(), 0o644)}),
        Deb(names["smi"], version, f"NVIDIA System Management Interface {driver}", **replaces("smi"),
            depends=(exact("nvml"),), files={"usr/bin/nvidia-smi": (smi, 0o755)}),
        Deb(names["persistenced"], version, f"NVIDIA persistence daemon {driver}", **replaces("persistenced"),
            files={"usr/lib/systemd/system/nvidia-persistenced.service": (persistenced, 0o644)}),
        # DKMS builds the module for the running kernel at configure time, and needs its headers.
        Deb(names["module"], version, f"NVIDIA open kernel module {driver} (DKMS source)", **replaces("module"),
            files={f"usr/src/nvidia-{driver}/README": (f"{LABEL}\n".encode(), 0o644)}, scripts={
                "postinst": (
                    'if [ "$1" = configure ]; then\n'
                    '  if [ ! -d "/lib/modules/$(uname -r)/build" ]; then\n'
                    '    echo "Error! Your kernel headers for kernel $(uname -r) cannot be found at '
                    '/lib/modules/$(uname -r)/build" >&2; exit 1\n  fi\n'
                    f'  mkdir -p "$(dirname /{MODULE_PATH})"\n'
                    f'  echo "{driver} open" > "/{MODULE_PATH}"\nfi\n'),
                "prerm": f'rm -f "/{MODULE_PATH}"\n'}),
        Deb(names["meta"], version, f"NVIDIA open driver {driver} (metapackage)",
            depends=(exact("module"), exact("smi"), exact("persistenced"))),
        Deb("nvidia-fabricmanager", fabric_version(family, driver), f"NVIDIA fabric manager {driver}",
            provides=(f"nvidia-fabricmanager-{branch} (= {fabric_version(family, driver)})",), files={
                "usr/lib/systemd/system/nvidia-fabricmanager.service": (fabricmanager, 0o644),
                "usr/bin/nv-fabricmanager": (nv_fabricmanager.encode(), 0o755)}),
    ]


def _pinning_deb(family: str, branch: int) -> Deb:
    """What NVIDIA's pinning package installs: an apt preference holding the driver's packages to the
    branch (Pin-Priority 1000). One at a time: each conflicts with every other."""
    names = part_names(family, branch)
    pin = (f"Package: {' '.join(names.values())} nvidia-fabricmanager\n"
           f"Pin: version {branch}.*\nPin-Priority: 1000\n")
    return Deb(f"nvidia-driver-pinning-{branch}", pinning_version(family, branch),
               f"APT driver pinning file for driver branch {branch}", arch="all",
               provides=("nvidia-driver-pinning",), conflicts=("nvidia-driver-pinning",),
               replaces=("nvidia-driver-pinning",), files={PIN_FILE: (pin.encode(), 0o644)})


def _keyring_deb(os_release: str, public_key: bytes) -> Deb:
    keyring = "usr/share/keyrings/cuda-archive-keyring.gpg"
    source = f"deb [signed-by=/{keyring}] {APT_URL}/{os_release}/{ARCH}/ /\n"
    return Deb("cuda-keyring", KEYRING_VERSION, f"the lab's apt key for the {os_release} CUDA repository", arch="all",
               files={keyring: (public_key, 0o644),
                      f"etc/apt/sources.list.d/cuda-{os_release}-{ARCH}.list": (source.encode(), 0o644)})


def release_debs(os_release: str, public_key: bytes = b"") -> list[Deb]:
    """Every package of the repository of `os_release` (a key of OS_RELEASES)."""
    family = OS_RELEASES[os_release]
    debs = [_keyring_deb(os_release, public_key)]
    for driver in DRIVER_VERSIONS:
        debs += _driver_debs(family, driver)
    debs += [_pinning_deb(family, branch) for branch in sorted({_branch(d) for d in DRIVER_VERSIONS})
             if pinned(family, branch)]
    debs.append(Deb("nvlsm", NVLSM_VERSION, "NVLink Subnet Manager"))
    # On a real host the running kernel's headers come from the distribution's archive.
    debs.append(Deb(f"linux-headers-{KERNEL_RELEASE}", "1-lab", f"Linux kernel headers for {KERNEL_RELEASE}",
                    files={f"usr/src/linux-headers-{KERNEL_RELEASE}/README": (f"{LABEL}\n".encode(), 0o644),
                           f"lib/modules/{KERNEL_RELEASE}/build": (f"/usr/src/linux-headers-{KERNEL_RELEASE}".encode(),
                                                                  0)}))
    return debs


def _gpg(home: Path, *args: str, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(["gpg", "--batch", "--quiet", "--homedir", str(home), *args], check=True,
                          capture_output=True, **kwargs)


def _signed_index(home: Path, root: Path, pool: str, packages_dir: Path, release_dir: Path,
                  fields: dict[str, str]) -> None:
    """Packages (and .gz) in `packages_dir` for the .debs under root/pool (paths relative to root), then
    `release_dir`'s Release with `fields`, signed with the lab's key (InRelease, Release.gpg)."""
    packages = subprocess.run(["apt-ftparchive", "packages", pool], cwd=root, check=True, capture_output=True).stdout
    (packages_dir / "Packages").write_bytes(packages)
    subprocess.run(["gzip", "-9kn", "Packages"], cwd=packages_dir, check=True)
    options = [part for field, value in {**fields, "Architectures": DEB_ARCH}.items()
               for part in ("-o", f"APT::FTPArchive::Release::{field}={value}")]
    release = subprocess.run(["apt-ftparchive", *options, "release", "."], cwd=release_dir, check=True,
                             capture_output=True).stdout
    (release_dir / "Release").write_bytes(release)
    _gpg(home, "--yes", "--clearsign", "-o", str(release_dir / "InRelease"), str(release_dir / "Release"))
    _gpg(home, "--yes", "-abs", "-o", str(release_dir / "Release.gpg"), str(release_dir / "Release"))


def _signing_key(out: Path) -> tuple[Path, bytes]:
    """The lab's signing key, made once per lab: its GNUPGHOME and its public key."""
    home = out / "gnupg"
    if not (home / "public.gpg").exists():
        shutil.rmtree(home, ignore_errors=True)
        home.mkdir(mode=0o700, parents=True)
        _gpg(home, "--passphrase", "", "--quick-gen-key", "specfleet lab apt <lab@specfleet.invalid>",
             "ed25519", "sign", "never")
        (home / "public.gpg").write_bytes(_gpg(home, "--export").stdout)
    return home, (home / "public.gpg").read_bytes()


def _debian_apt(cache: Path, *args: str) -> subprocess.CompletedProcess:
    """The controller's apt on its own lists, archives and an empty dpkg status (a host with nothing installed)."""
    options = {"Dir::Etc::sourcelist": cache / "sources.list", "Dir::Etc::sourceparts": cache / "none",
               "Dir::Etc::preferences": cache / "none", "Dir::Etc::preferencesparts": cache / "none",
               "Dir::State::Lists": cache / "lists", "Dir::State::status": cache / "status",
               "Dir::Cache::archives": cache / "archives", "APT::Architectures": DEB_ARCH,
               "APT::Architecture": DEB_ARCH}
    return subprocess.run(["apt-get", "-q", *(f"-o{k}={v}" for k, v in options.items()), *args],
                          check=True, capture_output=True, text=True)


def _debian_debs(suite: str) -> list[Path]:
    """Debian's .debs of DEBIAN_PACKAGES and their dependencies for `suite`, downloaded once (cached).

    apt refuses an index whose InRelease is not signed by Debian's archive keyring and a .deb
    whose SHA256 is not the signed index's, so what lands in the cache is Debian's."""
    cache = DEBIAN_CACHE / suite
    stamp = cache / f"debs-{'-'.join(DEBIAN_PACKAGES)}"
    DEBIAN_CACHE.mkdir(parents=True, exist_ok=True)
    with open(DEBIAN_CACHE / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # labs side by side share the cache
        if not stamp.exists():
            for sub in ("lists/partial", "archives/partial", "none"):
                (cache / sub).mkdir(parents=True, exist_ok=True)
            (cache / "status").write_text("")
            (cache / "sources.list").write_text(
                f"deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] {rootfs.MIRROR} {suite} main\n")
            _debian_apt(cache, "update")
            _debian_apt(cache, "install", "--download-only", "--no-install-recommends", "-y",
                        *DEBIAN_PACKAGES)
            names = sorted(path.name for path in (cache / "archives").glob("*.deb"))
            stamp.write_text("\n".join(names) + "\n")
    return [cache / "archives" / name for name in stamp.read_text().split()]


def _debian_archive(out: Path, home: Path, suite: str) -> None:
    """out/debian: `dists/<suite>/main/binary-amd64` over `pool/main`, its Release signed by the lab."""
    root = out / "debian"
    pool, dist = root / "pool/main", root / "dists" / suite
    for directory in (pool, dist):
        shutil.rmtree(directory, ignore_errors=True)
    pool.mkdir(parents=True, exist_ok=True)
    (dist / f"main/binary-{DEB_ARCH}").mkdir(parents=True)
    for deb in _debian_debs(suite):
        shutil.copy2(deb, pool / deb.name)
    _signed_index(home, root, "pool/main", dist / f"main/binary-{DEB_ARCH}", dist, {
        "Origin": "Debian", "Label": "specfleet lab mirror of Debian", "Suite": suite, "Codename": suite,
        "Components": "main"})


def debian_source(root: Path, out: Path) -> None:
    """Make the lab's Debian mirror (built in `out`) the only Debian source of the host whose root is `root`."""
    release = (root / "etc/os-release").read_text()
    suite = next((line.split("=", 1)[1].strip('"') for line in release.splitlines()
                  if line.startswith("VERSION_CODENAME=")), "")
    public_key = out / "gnupg/public.gpg"
    if suite not in DEBIAN_SUITES or not public_key.exists():
        (root / "etc/apt/sources.list").write_text(f"# the lab serves no Debian mirror for {suite or 'this release'}\n")
        return
    shutil.copyfile(public_key, root / DEBIAN_KEYRING)
    (root / DEBIAN_KEYRING).chmod(0o644)
    (root / "etc/apt/sources.list").write_text(f"deb [signed-by=/{DEBIAN_KEYRING}] {DEBIAN_URL} {suite} main\n")


def _inputs_key() -> str:
    digest = hashlib.sha256(" ".join([*DRIVER_VERSIONS, *OS_RELEASES, NVLSM_VERSION, KEYRING_VERSION, KERNEL_RELEASE,
                                      APT_URL, DEBIAN_URL, *DEBIAN_PACKAGES, *DEBIAN_SUITES]).encode())
    for path in [Path(__file__), LAB / "gpu_standin/nvidia-smi", LAB / "vendor_units/nvidia-fabricmanager.service",
                 LAB / "host_files/usr/lib/systemd/system/nvidia-persistenced.service"]:
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def build(out: Path) -> None:
    stamp = out / ".built"
    key = _inputs_key()
    if stamp.exists() and stamp.read_text() == key:
        return
    home, public_key = _signing_key(out)
    for os_release in OS_RELEASES:
        repo = repo_dir(out, os_release)
        shutil.rmtree(repo, ignore_errors=True)
        repo.mkdir(parents=True)
        for deb in release_debs(os_release, public_key):
            _write_deb(repo, deb)
        _signed_index(home, repo, ".", repo, repo,
                      {"Origin": "specfleet lab", "Label": "specfleet lab stand-in for NVIDIA CUDA"})
    for suite in DEBIAN_SUITES:
        _debian_archive(out, home, suite)
    stamp.write_text(key)
    agent_stopped(out)


def agent_stopped(out: Path) -> None:
    """Stop the gpg-agent that signing started for the lab's key (gpg leaves one running per homedir, which
    would outlive the lab)."""
    home = out / "gnupg"
    if home.is_dir():
        subprocess.run(["gpgconf", "--homedir", str(home), "--kill", "gpg-agent"], check=False,
                       capture_output=True)


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -m lab.apt_repo")
    commands = parser.add_subparsers(dest="command", required=True)
    build_cmd = commands.add_parser("build")
    build_cmd.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    build(args.out)


if __name__ == "__main__":
    main(sys.argv[1:])
