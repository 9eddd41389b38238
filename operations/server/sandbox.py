"""The SGLang unit's confinement, for every process that imports a model's code (a hub repo's, with
--trust-remote-code): the replica's unit itself, and transient units (systemd-run) with its [Service]
settings for what runs the model's code outside it: the deploy's flag check, the bench's servers and
its client. None of them can read the HF token (the download user's, ``InaccessiblePaths``), write
the weights or what root later runs, reach another user's processes, or outlive its job."""

import ipaddress
import json
import shlex
import weakref
from collections.abc import Iterable

from pyinfra.context import ctx_host

from deployment.nodes.group import NodeGroup
from deployment.server import capacity, resident
from deployment.server.command_line import rendered_violations, server_args
from deployment.server.config import Server, ServiceHost
from operations.basics import gathering
from operations.basics.file_states import sha1_of
from operations.basics.templates import render
from operations.gpu.facts import NvidiaDriver, NvidiaGpus, unreadable
from operations.server.flags import SGLangRejects

# The unit's [Service] settings a transient unit sets itself: how it starts, restarts and reads its
# environment (the unit's, less the API key file: the transient units are keyless).
OWN_SETTINGS = ("Type", "ExecStart", "EnvironmentFile", "Restart", "RestartSec")
# The flag check parses the command line and reads the model's config (importing its code): no weights
# load, no GPU memory is taken. Seconds, a bound for a host whose disk or CPU is slow.
CHECK_MAX_S = 300


# The NVIDIA driver's device major (its GPUs are 195:<minor>, /dev/nvidiactl 195:255: the kernel module's
# NV_MAJOR_DEVICE_NUMBER). The rules name /dev/char/195:<minor>, which systemd turns into its device rule
# without the node (src/core/bpf-devices.c parses the number out of such a path; any other path it
# stat()s when the unit starts, and skips it where the node is not made yet, as right after a boot).
NVIDIA_MAJOR = 195
# The nodes CUDA opens besides its GPUs' own: the control device and unified memory's two (what NVIDIA's
# container toolkit gives every container with GPUs; nvidia-uvm's major is the kernel's choice, so its
# class by name). /dev/nvidia-caps/* serve MIG instances, which preflight refuses (operations/gpu/checks.py);
# /dev/nvidia-modeset serves displays.
GPU_CONTROL_NODES = (f"/dev/char/{NVIDIA_MAJOR}:255", "char-nvidia-uvm")


def gpu_minor_numbers() -> tuple[int | None, ...]:
    """The host's GPUs' device minor numbers, in nvidia-smi's index order (NvidiaDriver, from ``nvidia-smi -q``),
    read in the running operation; () where no driver is loaded."""
    driver = gathering.read(NvidiaDriver)
    return tuple(driver.get("gpu_minor_numbers") or ()) if driver else ()


def gpu_nodes(server: Server, minors: tuple[int | None, ...]) -> list[str]:
    """The device nodes the replica's processes may open (DeviceAllow=): each of its GPUs' /dev/nvidia<minor>,
    by its number (`minors`: ``gpu_minor_numbers``; a GPU's minor number is not its index: the first GPU in
    PCI order of an 8x RTX PRO 6000 host is /dev/nvidia2), then CUDA's control nodes. A GPU whose minor
    number nvidia-smi did not give has no node to allow (no driver loaded: preflight refuses such a host)."""
    own = [f"/dev/char/{NVIDIA_MAJOR}:{minors[gpu]}" for gpu in server.gpus
           if gpu < len(minors) and minors[gpu] is not None]
    return [*own, *GPU_CONTROL_NODES]


def unit_environment(server: Server, keyed: bool = True) -> list[tuple[str, str]]:
    """The replica unit's environment file, line by line (systemd takes a name's last line): the server's
    HF_HOME, offline (the weights are local), where the launcher finds the keys (host_scripts/launch_sglang.py;
    not with `keyed=False`, for the keyless transient units), then the configured environment and the
    replica's GPUs, by name."""
    keys = [("SPECFLEET_API_KEY_FILE", server.engine.service.api_key_file),
            ("SPECFLEET_ADMIN_API_KEY_FILE", server.engine.admin_key_file)] if keyed else []
    return [("HF_HOME", server.engine.server_hf_home), ("HF_HUB_OFFLINE", "1"), *keys,
            *sorted({**server.engine.env, **server.gpu_env}.items())]


def reached_from(server: Server, gateways: Iterable[str], group: NodeGroup | None) -> tuple[str, ...] | None:
    """The IP addresses beyond loopback that a replica's processes exchange packets with (its unit's
    IPAddressAllow=, beside loopback; everything else IPAddressDeny=any refuses, in both directions): its
    node group's other members, and `gateways`, the addresses of the run's gateways that route it on other
    hosts (each gateway host's own, where it connects from, and where the replica's host reaches its API).
    None, no list at all, for a server that listens beyond loopback where no gateway of the run routes it and
    `server_ip_allow` names nothing: its clients are the site's, unknown here. The unit admits
    `server_ip_allow`'s networks besides (each unit of the model's code does). torch's TCPStore on the
    replica's --nccl-port listens on every address whatever --host says (torch 2.14.1, measured): the list
    is what confines it."""
    peers = tuple(a for a in group.addresses if a != group.address) if group else ()
    gateways = tuple(gateways)
    service = server.engine.service
    if service.exposed and not gateways and not service.ip_allow and not (group and not group.serves_http):
        return None
    return tuple(sorted(set(peers + gateways), key=lambda a: ipaddress.ip_address(a)))


def unit_files(server: Server, inputs: str, minors: tuple[int | None, ...],
               allowed: tuple[str, ...] | None = ()) -> tuple[str, str]:
    """The rendered unit and environment file; `inputs` names what else forces a restart; `minors`: the
    host's GPUs' minor numbers (``gpu_minor_numbers``), whose nodes of the replica's GPUs the unit allows;
    `allowed`: the addresses beyond loopback its processes reach or are reached from (``reached_from``;
    None: no IP access list)."""
    env_text = render("server/sglang.env.j2", environment=unit_environment(server))
    unit_text = render("server/sglang.service.j2", s=server, e=server.engine, h=server.engine.service,
                       args=[shlex.quote(a) for a in server_args(server)],
                       inputs=f"{inputs} env={sha1_of(env_text.encode())[:12]}", devices=gpu_nodes(server, minors),
                       allowed=allowed)
    return unit_text, env_text


def service_settings(server: Server, minors: tuple[int | None, ...]) -> list[str]:
    """The replica unit's [Service] settings (user, limits, confinement, its GPUs' devices, writable paths),
    in the unit's order; what a transient unit sets itself (OWN_SETTINGS) left out. One source: the
    confinement is the SGLang unit's, whatever that unit says."""
    unit_text, _ = unit_files(server, "", minors)
    settings, section = [], None
    for line in unit_text.splitlines():
        line = line.strip()
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1]
        elif section == "Service" and line and not line.startswith(("#", ";")) and "=" in line \
                and line.split("=", 1)[0] not in OWN_SETTINGS:
            settings.append(line)
    return settings


def keyless(service: ServiceHost) -> list[str]:
    """A transient unit's settings beyond the unit's: the host's configuration directory (the API keys) out
    of its reach, and a stop that ends every process of it at once (it holds no request to drain)."""
    return [f"InaccessiblePaths=-{service.config_dir}", "KillMode=control-group"]


def check_settings(server: Server, minors: tuple[int | None, ...]) -> tuple[str, ...]:
    """The flag check's transient unit: the replica's confinement, keyless, ended after CHECK_MAX_S."""
    return (*service_settings(server, minors), *keyless(server.engine.service), f"RuntimeMaxSec={CHECK_MAX_S}")


# Per host, what its SGLang made of a command line in this run: preflight and the unit's restart
# decision ask the same question of the same build, and the host answers it once.
_rejections: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def startup_sizing(server: Server, min_kv_tokens: int | None) -> str:
    """What the host check's startup arithmetic is handed (SGLangRejects' `sizing`): the smallest of the
    replica's GPUs as the host reports them, what SGLang would find free on it before the load (the card
    less what CUDA does not show of it and what a rank holds then, as the plan counts them:
    resident.cuda_unseen_bytes, resident.resident_before_load) and the floor (`min_kv_tokens`; None: one
    full context); "" where the host's GPUs could not be read (the check then judges the flags alone)."""
    gpus = gathering.read(NvidiaGpus)
    found = {} if unreadable(gpus) else {g.get("index"): g for g in gpus or []}
    cards = [found[i].get("memory_total_mib") for i in server.gpus if i in found]
    if not cards or not all(cards) or len(cards) < len(server.gpus):
        return ""
    card = min(cards) * capacity.MIB
    before = card - resident.cuda_unseen_bytes(card) - resident.resident_before_load(server.engine.tp_size)
    return json.dumps({"card_mib": min(cards), "before_load_mib": before / capacity.MIB, "min_tokens": min_kv_tokens})


def rejection(host, server: Server, args: list[str], startup: bool = False,
              min_kv_tokens: int | None = None) -> str | None:
    """Why the host's installed SGLang would refuse to start `args` for this server, or None:
    resolved in a transient unit confined as the replica's (as its deployment's user, keyless), with the
    unit's environment and the server's HF_HOME, offline; with `startup`, its scheduler's startup
    arithmetic is run too, on the host's GPUs and weights, a pool below `min_kv_tokens` (None: one full
    context) refused. A DDTree build that accepts them is held to the deploy's DDTree rules as well."""
    env = (("HF_HOME", server.engine.server_hf_home), *sorted(server.engine.env.items()))
    settings = check_settings(server, gpu_minor_numbers())
    sizing = startup_sizing(server, min_kv_tokens) if startup else ""
    asked = (server.engine.venv, server.engine.sglang_requirement, tuple(args), env, settings, sizing)
    answers = _rejections.setdefault(ctx_host.get(), {})
    if asked not in answers:
        answers[asked] = host.get_fact(SGLangRejects, venv=server.engine.venv, args=tuple(args), env=env,
                                       settings=settings, sizing=sizing)
    return answers[asked] or next(iter(rendered_violations(server)), None)
