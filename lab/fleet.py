"""Lab hosts: Debian bookworm (or trixie: `lab up --os trixie`) containers booted with systemd-nspawn.

Each host is a real system (systemd as PID 1, sshd, systemd-networkd) in its own
network namespace, joined to the controller by a veth link on the lab bridge.
Its root is an overlay over the shared base root, so a host costs a mount, not
a copy, and `down` throws the overlay away.
"""

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from lab import apt_repo, boot, rootfs
from lab.config import BRIDGE, CONTROLLER_IP, HOST_LAB_ETC, LAB_DIR, LAB_ID, PREFIX_LEN, SUBNET
from lab.services import APT_DIR

# Host classes the lab stands in for (of deployment.site_data.host_classes): short name used in host
# names and --hosts -> the inventory group, the GPU profile (named after it), the third address octet.
# Each octet is the lab's own, fixed here: a class added to the product shifts no lab address.
# A GPU-less gateway host (`gateway=1` -> lab-gateway-1, in the inventory's `gateway` group):
# its GPU profile names none, so /proc/driver stays empty.
CLASSES = {
    "pcie": ("rtx_pro_6000_pcie", "rtx_pro_6000_pcie", 1),
    "b200": ("b200_nvlink", "b200_nvlink", 2),
    "b300": ("b300_nvlink", "b300_nvlink", 3),
    "h100": ("h100_sxm", "h100_sxm", 4),
    "h200": ("h200_sxm", "h200_sxm", 5),
    "gateway": ("gateway", "none", 9),
}
DEFAULT_SPEC = "pcie=1,b200=1"

HOSTS_DIR = LAB_DIR / "hosts"
FLEET_FILE = LAB_DIR / "fleet.json"
SSH_KEY = LAB_DIR / "ssh" / "id_ed25519"


@dataclass
class LabHost:
    name: str
    host_class: str
    address: str
    gpu_profile: str
    suite: str = rootfs.DEFAULT_SUITE  # the Debian release its root is built from (lab/rootfs.py)

    @property
    def dir(self) -> Path:
        return HOSTS_DIR / self.name

    @property
    def root(self) -> Path:
        return self.dir / "root"

    @property
    def pid_file(self) -> Path:
        return self.dir / "nspawn.pid"

    @property
    def machine(self) -> str:
        """nspawn's machine name, unique across labs: the host-side veth is named after it."""
        return self.name if LAB_ID == 0 else f"l{LAB_ID}{self.name.removeprefix('lab')}"


def parse_spec(spec: str) -> list[LabHost]:
    """`pcie=2,b200=1` -> lab-pcie-1, lab-pcie-2, lab-b200-1 with their classes and addresses."""
    hosts = []
    for part in filter(None, spec.split(",")):
        short, _, count = part.partition("=")
        if short not in CLASSES or not count.isdigit():
            raise SystemExit(f"lab: bad --hosts entry {part!r}: use e.g. pcie=2,b200=1,h100=1 (of {', '.join(CLASSES)})")
        host_class, profile, octet = CLASSES[short]
        for index in range(1, int(count) + 1):
            hosts.append(LabHost(f"lab-{short}-{index}", host_class, f"{SUBNET}.{octet}.{index + 9}",
                                 profile))
    if len(hosts) > 8:
        raise SystemExit("lab: at most 8 hosts fit on this machine")
    return hosts


def read_fleet() -> list[LabHost]:
    if not FLEET_FILE.exists():
        return []
    return [LabHost(**entry) for entry in json.loads(FLEET_FILE.read_text())["hosts"]]


def _write_fleet(hosts: list[LabHost]) -> None:
    FLEET_FILE.write_text(json.dumps({"ssh_key": str(SSH_KEY), "hosts": [asdict(h) for h in hosts]},
                                     indent=2))


def _pid(host: LabHost) -> int | None:
    try:
        pid = int(host.pid_file.read_text())
        os.kill(pid, 0)
        # The pid must still be this host's nspawn, not a recycled number.
        if f"--machine={host.machine}" in Path(f"/proc/{pid}/cmdline").read_text():
            return pid
    except (FileNotFoundError, ValueError, ProcessLookupError):
        pass
    return None


def is_running(host: LabHost) -> bool:
    return _pid(host) is not None


def ensure_bridge() -> None:
    if not Path(f"/sys/class/net/{BRIDGE}").exists():
        subprocess.run(["ip", "link", "add", BRIDGE, "type", "bridge"], check=True)
    addresses = subprocess.run(["ip", "-br", "addr", "show", BRIDGE], capture_output=True,
                               text=True, check=True).stdout
    if CONTROLLER_IP not in addresses:
        subprocess.run(["ip", "addr", "add", f"{CONTROLLER_IP}/{PREFIX_LEN}", "dev", BRIDGE], check=True)
    subprocess.run(["ip", "link", "set", BRIDGE, "up"], check=True)


def remove_bridge() -> None:
    if Path(f"/sys/class/net/{BRIDGE}").exists():
        subprocess.run(["ip", "link", "del", BRIDGE], check=True)


# Each booted host's systemd holds inotify instances counted against root on the controller (no user
# namespace): the kernel's default of 128 runs out with a few labs side by side, and a host booted then
# hangs ("Failed to create inotify object: Too many open files"). LXD's production settings use 1024.
INOTIFY_INSTANCES = 1024
INOTIFY_LIMIT = Path("/proc/sys/fs/inotify/max_user_instances")


def ensure_inotify_instances() -> None:
    if int(INOTIFY_LIMIT.read_text()) < INOTIFY_INSTANCES:
        INOTIFY_LIMIT.write_text(f"{INOTIFY_INSTANCES}\n")


def ensure_ssh_key() -> None:
    if not SSH_KEY.exists():
        SSH_KEY.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "specfleet-lab",
                        "-f", str(SSH_KEY)], check=True)


# A freshly imaged machine: the image's driver gone (nvidia-smi, the persistence daemon's unit),
# no NVIDIA package, no NVIDIA repository or pin. The flag keeps the lab's GPU unit from laying
# the driver's /proc files until a driver installed from packages is loaded at boot.
NO_DRIVER = "no-driver"
_REMOVE_DRIVER = f"""
packages=$(dpkg -l 'nvidia-*' 'libnvidia-*' 'linux-headers-*' cuda-keyring nvlsm 2>/dev/null \\
           | awk '/^[a-z][a-zA-Z] / && $1 != "un" {{print $2}}')
if [ -n "$packages" ]; then apt-mark unhold $packages >/dev/null; dpkg --purge $packages >/dev/null; fi
rm -f /usr/bin/nvidia-smi /usr/lib/systemd/system/nvidia-persistenced.service \\
      /etc/systemd/system/multi-user.target.wants/nvidia-persistenced.service \\
      /etc/apt/sources.list.d/cuda-*.list /etc/apt/preferences.d/nvidia-* \\
      /usr/share/keyrings/cuda-archive-keyring.gpg /etc/modules-load.d/ib_umad.conf \\
      /var/lib/apt/lists/*_compute_cuda_repos_*
touch {HOST_LAB_ETC}/{NO_DRIVER}
"""


def _prepare_root(host: LabHost, base: Path, bare: bool = False) -> None:
    """Mount the host's overlay and write what makes it this host."""
    for sub in ("upper", "work", "root"):
        (host.dir / sub).mkdir(parents=True, exist_ok=True)
    if not os.path.ismount(host.root):
        subprocess.run(["mount", "-t", "overlay", "overlay", "-o",
                        f"lowerdir={base},upperdir={host.dir / 'upper'},workdir={host.dir / 'work'}",
                        str(host.root)], check=True)
    root = host.root
    (root / "etc/hostname").write_text(host.name + "\n")
    (root / "etc/hosts").write_text(f"127.0.0.1 localhost\n127.0.1.1 {host.name}\n"
                                    f"{CONTROLLER_IP} lab-controller\n")
    # Sorts before 80-container-host0.network, which would otherwise ask for DHCP.
    (root / "etc/systemd/network/10-lab-host0.network").write_text(
        f"[Match]\nName=host0\n\n[Network]\nAddress={host.address}/{PREFIX_LEN}\n"
        "LinkLocalAddressing=no\nIPv6AcceptRA=no\n")
    ssh_dir = root / "root/.ssh"
    ssh_dir.mkdir(mode=0o700, exist_ok=True)
    (ssh_dir / "authorized_keys").write_text(SSH_KEY.with_suffix(".pub").read_text())
    (ssh_dir / "authorized_keys").chmod(0o600)
    # An ed25519 host key alone: `ssh-keygen -A` also made RSA 3072 and ECDSA keys, 0.6 CPU-s a host boot,
    # for clients (OpenSSH, paramiko) that all take ed25519.
    host_key = root / "etc/ssh/ssh_host_ed25519_key"
    if not host_key.exists():
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "", "-f", str(host_key)], check=True,
                       stdout=subprocess.DEVNULL)
    # No Debian mirror on the internet is reachable from the lab's hosts: their Debian source is
    # the lab's mirror of the Debian packages a deploy installs (lab/apt_repo.py).
    apt_repo.debian_source(root, APT_DIR)
    # The lab's index is plain http on the lab network, as a site's internal mirror may be.
    (root / "etc/pip.conf").write_text(f"[global]\ntrusted-host = {CONTROLLER_IP}\n")
    lab_etc = root / "etc/specfleet-lab"
    lab_etc.mkdir(exist_ok=True)
    (lab_etc / "gpu-profile").write_text(host.gpu_profile + "\n")
    (lab_etc / "host-class").write_text(host.host_class + "\n")
    if bare:
        subprocess.run(["chroot", str(root), "sh", "-ec", _REMOVE_DRIVER], check=True)


# A host's systemd enforces units' IP access lists (IPAddressDeny=/IPAddressAllow=, the SGLang replicas'
# confinement) and device lists with cgroup v2 BPF programs, as on a real Debian host: it needs the unified
# cgroup hierarchy (nspawn gives a container the machine's hybrid layout otherwise, where systemd 252
# attaches no IP filter) and bpf(), which nspawn's default system-call filter refuses.
ENFORCING_SYSTEMD = ("--system-call-filter=bpf",)
ENFORCING_SYSTEMD_ENV = {"SYSTEMD_NSPAWN_UNIFIED_HIERARCHY": "1"}


def _boot(host: LabHost) -> None:
    """Boot the host under lab.boot, which boots it again each time it reboots itself."""
    log = open(host.dir / "console.log", "ab")
    process = subprocess.Popen(
        [sys.executable, "-m", "lab.boot",
         "systemd-nspawn", "--register=no", "--keep-unit", "--boot", "--quiet",
         f"--directory={host.root}", f"--machine={host.machine}", f"--network-bridge={BRIDGE}",
         "--console=read-only", *ENFORCING_SYSTEMD],
        cwd=Path(__file__).resolve().parent.parent, env={**os.environ, **ENFORCING_SYSTEMD_ENV},
        stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True,
    )
    host.pid_file.write_text(str(process.pid))


# The lab's tools and tests reach a host through one connection (OpenSSH's ControlMaster, kept 30 s after its
# last use), as testinfra's ssh backend does: a connection each call cost ~0.1 CPU-s of key exchange and login
# on the controller and the host, about 1,250 of them a make test. A connection that dies (the host rebooted
# or stopped) is noticed within 6 s (ServerAlive*), and a stopped host's is closed (stop_host).
SSH_MULTIPLEX = ["-o", "ControlMaster=auto", "-o", f"ControlPath={LAB_DIR}/ssh/cm-%C", "-o", "ControlPersist=30",
                 "-o", "ServerAliveInterval=2", "-o", "ServerAliveCountMax=3"]


def ssh_command(host: LabHost, command: str) -> list[str]:
    return ["ssh", "-i", str(SSH_KEY), "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=no",
            "-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR", "-o", "ConnectTimeout=3",
            *SSH_MULTIPLEX, f"root@{host.address}", command]


def ssh(host: LabHost, command: str, check: bool = True, timeout: float = 60) -> str:
    result = subprocess.run(ssh_command(host, command), capture_output=True, text=True,
                            timeout=timeout)
    if check and result.returncode != 0:
        raise RuntimeError(f"{host.name}: `{command}` failed ({result.returncode}): {result.stderr}")
    return result.stdout


def system_state(host: LabHost) -> str:
    """`systemctl is-system-running` on the host, or why it cannot be asked."""
    if not is_running(host):
        return "stopped"
    try:
        with socket.create_connection((host.address, 22), timeout=1):
            pass
    except OSError:
        return "booting"
    result = subprocess.run(ssh_command(host, "systemctl is-system-running"), capture_output=True,
                            text=True, timeout=30)
    return result.stdout.strip() or "unreachable"


def wait_ready(hosts: list[LabHost], timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    pending = list(hosts)
    while pending:
        pending = [h for h in pending if system_state(h) not in ("running", "degraded")]
        if not pending:
            return
        if time.monotonic() > deadline:
            states = ", ".join(f"{h.name}={system_state(h)}" for h in pending)
            raise SystemExit(f"lab: hosts not up after {timeout:.0f}s: {states} "
                             f"(see {HOSTS_DIR}/<host>/console.log)")
        time.sleep(1)


def stop_host(host: LabHost) -> None:
    if host.address:  # its shared connection, which a host booted next under the address must not inherit
        subprocess.run(["ssh", *SSH_MULTIPLEX, "-O", "exit", f"root@{host.address}"], capture_output=True,
                       timeout=10, check=False)
    pid = _pid(host)
    if pid and not boot.kill_machine(host.machine):
        # nspawn turns SIGTERM into a clean poweroff of the container's systemd.
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 30
        while _pid(host) and time.monotonic() < deadline:
            time.sleep(0.2)
        if _pid(host):
            os.kill(pid, signal.SIGKILL)
            time.sleep(0.5)
    # The kernel tears the container's network namespace down after nspawn exits, asynchronously:
    # a host booted again at once under the same name would find its veth still there ("File exists").
    veth = Path("/sys/class/net") / f"vb-{host.machine}"[:15]
    deadline = time.monotonic() + 10
    while veth.exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    if veth.exists():
        subprocess.run(["ip", "link", "del", veth.name], check=False)
    if os.path.ismount(host.root):
        subprocess.run(["umount", "-l", str(host.root)], check=False)
    shutil.rmtree(host.dir, ignore_errors=True)


def up(spec: str = DEFAULT_SPEC, log=print, bare: set[str] = frozenset(),
       suite: str = rootfs.DEFAULT_SUITE) -> list[LabHost]:
    """Converge the fleet to `spec`: boot missing hosts in parallel, stop hosts not asked for.
    Hosts named in `bare` that are booted now start as freshly imaged machines (no driver); hosts
    booted now boot from Debian `suite` (running hosts keep theirs)."""
    wanted = parse_spec(spec)
    wanted_names = {h.name for h in wanted}
    running = {}
    for host in read_fleet():
        if host.name not in wanted_names:
            log(f"lab: stopping {host.name} (not in {spec})")
            stop_host(host)
        running[host.name] = host.suite
    base = rootfs.build_base(log, suite)
    ensure_bridge()
    ensure_ssh_key()
    ensure_inotify_instances()
    for host in wanted:
        if is_running(host):
            host.suite = running.get(host.name, rootfs.DEFAULT_SUITE)
        else:
            log(f"lab: booting {host.name} ({host.host_class}, {host.address}, Debian {suite})")
            host.suite = suite
            _prepare_root(host, base, bare=host.name in bare)
            _boot(host)
    _write_fleet(wanted)
    wait_ready(wanted)
    return wanted


def down(log=print) -> None:
    hosts = read_fleet()
    # Hosts booted by an older fleet file are found by their directories too.
    names = {h.name for h in hosts} | ({p.name for p in HOSTS_DIR.iterdir()} if HOSTS_DIR.exists() else set())
    stopping = []
    for name in sorted(names):
        short = re.sub(r"^lab-(\w+)-\d+$", r"\1", name)
        stopping.append(next((h for h in hosts if h.name == name),
                             LabHost(name, CLASSES.get(short, ("", "", 0))[0], "", "")))
        log(f"lab: stopping {name}")
    # A host's poweroff takes its systemd seconds (the first-deploy matrix's five hosts took 116 s one after
    # another on the loaded 2-core machine): all at once.
    with ThreadPoolExecutor(max(len(stopping), 1)) as pool:
        list(pool.map(stop_host, stopping))
    FLEET_FILE.unlink(missing_ok=True)
    remove_bridge()


def set_gpu_profile(host: LabHost, profile: str) -> None:
    """Switch a running host's GPU stand-in profile (fault tests: degraded NVLink, wrong count...).
    `no-driver` keeps the hardware and makes its software a freshly imaged machine's (see NO_DRIVER)."""
    if profile == NO_DRIVER:
        ssh(host, f"systemctl disable --now nvidia-fabricmanager nvidia-persistenced 2>/dev/null; "
                  f"{_REMOVE_DRIVER} rmdir /sys/module/ib_umad 2>/dev/null; systemctl daemon-reload; "
                  "rm -f /run/specfleet-lab/loaded-module; systemctl restart specfleet-lab-gpu.service",
            timeout=120)
        return
    ssh(host, f"test -d /usr/share/specfleet-lab/gpu-profiles/{profile} && "
              f"echo {profile} > /etc/specfleet-lab/gpu-profile && "
              "systemctl restart specfleet-lab-gpu.service")
    fleet = [h if h.name != host.name else replace(h, gpu_profile=profile) for h in read_fleet()]
    _write_fleet(fleet)
