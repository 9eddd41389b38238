"""The lab's Debian root filesystems (bookworm, and trixie for `lab up --os trixie`), each built
once and shared by every host booted from it.

Each host boots from an overlay whose lower layer is its suite's root, so building it
is the only slow step (about 90 s with debootstrap) and it happens once per machine
and suite: the root is kept under CACHE_DIR keyed by what goes into it, and every lab
on the machine boots from it.
"""

import fcntl
import hashlib
import re
import shutil
import subprocess
from pathlib import Path

from lab.config import CACHE_DIR

MIRROR = "http://deb.debian.org/debian"
SUITES = ("bookworm", "trixie")  # Debian 12 (the lab's default), Debian 13
DEFAULT_SUITE = SUITES[0]

# What a fresh cloud GPU image has that the deploy relies on: systemd, sshd,
# python3 with venv (pyinfra facts and the service's virtualenv), curl, sudo.
PACKAGES = [
    "systemd", "systemd-sysv", "dbus", "openssh-server", "python3", "python3-venv",
    "iproute2", "ca-certificates", "curl", "procps", "sudo", "kmod", "util-linux",
]

# Units a container neither needs nor can run; masking keeps `systemctl
# is-system-running` at `running` and boot fast.
MASKED_UNITS = [
    "apt-daily.timer", "apt-daily-upgrade.timer", "e2scrub_all.timer",
    "e2scrub_reap.service", "systemd-timesyncd.service", "fstrim.timer",
]

LAB_FILES = Path(__file__).parent / "host_files"


def _key(suite: str) -> str:
    """Changes whenever the suite, the packages or the files baked into the root change."""
    digest = hashlib.sha256(" ".join([suite, *PACKAGES, *MASKED_UNITS]).encode())
    lab = Path(__file__).parent
    for path in sorted([*LAB_FILES.rglob("*"), *(lab / "gpu_standin").rglob("*"), *(lab / "vendor_units").rglob("*")]):
        if path.is_file() and "__pycache__" not in path.parts:
            digest.update(path.relative_to(lab).as_posix().encode())  # checkouts with the same files share it
            digest.update(path.read_bytes())
    return digest.hexdigest()[:12]


def _prefix(suite: str) -> str:
    """Cache directories are PREFIX + key: `base-<key>` for bookworm, `base-trixie-<key>` for trixie."""
    return "base-" if suite == DEFAULT_SUITE else f"base-{suite}-"


def base_root(suite: str = DEFAULT_SUITE) -> Path:
    return CACHE_DIR / f"{_prefix(suite)}{_key(suite)}" / "root"


def build_base(log=print, suite: str = DEFAULT_SUITE) -> Path:
    """Return the shared root of `suite`, debootstrapping it first if this key has none."""
    if suite not in SUITES:
        raise SystemExit(f"lab: no root for Debian {suite!r}: use one of {', '.join(SUITES)}")
    root = base_root(suite)
    if (root.parent / "complete").exists():
        return root  # built: no need to queue behind another lab building its own base
    CACHE_DIR.mkdir(parents=True, exist_ok=True)
    # Labs side by side share the base: the first to need it builds it, the others wait.
    with open(CACHE_DIR / "base.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (root.parent / "complete").exists():
            _build(root, suite, log)
    return root


def _build(root: Path, suite: str, log) -> None:
    staging = root.parent.with_name(root.parent.name + ".staging")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    cache = CACHE_DIR / "debootstrap-cache"  # keeps the .debs: a rebuild after a key change is offline
    cache.mkdir(parents=True, exist_ok=True)
    log(f"lab: debootstrapping {suite} into {staging} (once per machine)")
    subprocess.run(
        ["debootstrap", "--variant=minbase", f"--include={','.join(PACKAGES)}",
         f"--cache-dir={cache}", suite, str(staging / "root"), MIRROR],
        check=True, stdout=subprocess.DEVNULL,
    )
    _customise(staging / "root")
    (staging / "complete").touch()
    staging.rename(root.parent)
    _remove_stale(root.parent, suite)


def _remove_stale(base_dir: Path, suite: str) -> None:
    """Remove the older roots of `suite` that no host boots from; another suite's root, or one being
    built (`.staging`), stays."""
    for stale in CACHE_DIR.glob(f"{_prefix(suite)}*"):
        if re.fullmatch(r"[0-9a-f]{12}", stale.name.removeprefix(_prefix(suite))) and stale != base_dir \
                and not _in_use(stale):
            shutil.rmtree(stale, ignore_errors=True)


def _in_use(base_dir: Path) -> bool:
    mounts = Path("/proc/mounts").read_text()
    return str(base_dir) in mounts


def _customise(root: Path) -> None:
    def chroot(*args: str) -> None:
        subprocess.run(["chroot", str(root), *args], check=True, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)

    chroot("systemctl", "enable", "systemd-networkd", "ssh")
    chroot("systemctl", "mask", *MASKED_UNITS)
    # Host keys are made per host at first boot-prep, never shared through the base.
    for key in (root / "etc/ssh").glob("ssh_host_*"):
        key.unlink()
    # The lab's own files: GPU stand-in, its profile switcher, stand-in driver daemons.
    shutil.copytree(LAB_FILES, root, dirs_exist_ok=True, symlinks=True)
    standin = Path(__file__).parent / "gpu_standin"
    shutil.copy2(standin / "nvidia-smi", root / "usr/bin/nvidia-smi")
    (root / "usr/bin/nvidia-smi").chmod(0o755)
    shutil.copytree(standin / "profiles", root / "usr/share/specfleet-lab/gpu-profiles",
                    dirs_exist_ok=True)
    chroot("systemctl", "enable", "specfleet-lab-gpu.service")

