"""Every knob specfleet reads, each declared once: its name, type, one line of help, the layers that may set it,
where its default lives and the parser of its value.

`refused()` checks the keys a layer sets (shipped group data, the site's group data, an inventory host's data,
--data) before anything changes: an unknown key is refused in one line naming it, where it was set and the
nearest known key, as Ansible's argument_specs refuses a role's unknown option. A subject reads a knob's
parsed value with `value(data, name)`: the knob's parser (deployment/knobs.py), applied to the data's
value or, where the data has none, the declared default. A default lives in one place: the group file the
knob names (group_data/<group>.py, what users read and edit), else the declaration's `default`. A knob whose
value is a structure (profiles, layouts, node groups, ...) is parsed by its subject's `resolve`, which alone
knows its shape. docs/configuration.md is written from this table by `python -m tools.configuration_page`.
Adding a knob is adding its entry to KNOBS (and its value to its group file, where it has one).
"""

import difflib
import functools
import re
import types
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from deployment import knobs, network

# Where a key may be set. GROUP: a group data file (group_data/<group>.py, an inventory's group data);
# SITE: SPECFLEET_SITE/group_data/<group>.py; HOST: an inventory host's own data; DATA: pyinfra's --data.
GROUP, SITE, HOST, DATA = "group data", "site group data", "inventory host data", "--data"
LAYERS = (GROUP, SITE, HOST, DATA)
# True of one host: its inventory entry (or --data with --limit) says it; group data holds the default. A
# site file sets a group's values, for every host in it.
PER_HOST = (GROUP, HOST, DATA)


@dataclass(frozen=True)
class Knob:
    """One knob, e.g. Knob("port", "port", "each replica listens on port + ...", subject="server",
    parse=_PORT): group_data/all.py holds its default (30000), `value(data, "port")` its parsed value."""

    name: str
    type: str  # as the reference page says it
    help: str  # one line
    layers: tuple[str, ...] = LAYERS
    # The group file whose value is the default (group_data/<group>.py); "" where none sets it (`default`).
    group: str = "all"
    subject: str = "deployment"  # the section of the reference page
    serves: bool = False  # it says what a host serves: a deploy refuses it from --data (``deploy_data_refused``)
    # (name, value) -> the parsed value, or BadHostData naming the knob; None: its subject's resolve parses it.
    parse: Callable[[str, Any], Any] | None = None
    default: Any = None  # the value where the data has none, for a knob no group file sets (group "")
    refused_by: str = ""  # a retired knob: the subject that refuses it, saying `help` (what replaced it)
    # A URL knob: the boolean knob that trusts it over plain HTTP, and what then travels unprotected.
    https_unless: tuple[str, str] = ()


def _integer(minimum: int, maximum: int | None = None) -> Callable[[str, Any], int]:
    return functools.partial(knobs.integer, minimum=minimum, maximum=maximum)


def _matching(pattern: re.Pattern, accepted: str) -> Callable[[str, Any], str]:
    return functools.partial(knobs.matching, pattern=pattern, accepted=accepted)


def _optional(parse: Callable[[str, Any], Any]) -> Callable[[str, Any], Any]:
    """`parse`, with None passing as None (a knob whose None means "derived": see its help)."""
    return lambda name, value: None if value is None else parse(name, value)


def _retired(name: str, value: Any) -> None:
    """A retired knob's parser: set, it is refused with the sentence its declaration holds."""
    if value is not None:
        raise knobs.refused(name, value, BY_NAME[name].help)


_PORT = _integer(1, 65535)
_VARIABLE = _matching(knobs.ENV_NAME, "a variable name")
_UNIT = _matching(knobs.UNIT_NAME, "a unit name (letters, digits, _.-)")
_GATEWAY_REQUIREMENT = functools.partial(knobs.requirement, accepted="a pip requirement on one line (e.g. smg==1.13.0)")
_CLASS = "a host class"  # group: the value is per class (group_data/<class>.py)

KNOBS = (
    # What is served.
    Knob("profile", "name", "the deployment profile, a key of `profiles`", serves=True),
    Knob("profiles", "dict", "each profile: target and drafter repos, speculative algorithm, SGLang build, "
         "server args, env", serves=True),
    Knob("deployments", "list or None", "several models on one host: dict(profile=..., gpus=[...]) each; "
         "None: `profile` on all GPUs", serves=True),
    Knob("layouts", "dict", "per profile, how the class serves it: tp_size, replicas, GPUs, context_length",
         group=_CLASS, serves=True),
    Knob("mirrors", "dict", "repos and requirements a site serves under other names"),
    Knob("pins", "dict", "the commits pin.py resolved moving revisions to (SPECFLEET_SITE/pins.json)", (GROUP,)),
    Knob("tuned", "dict", "per profile, the settings tune.py measured best on the class "
         "(SPECFLEET_SITE/tuned/CLASS/PROFILE.json)", (GROUP,), group=_CLASS),
    Knob("allow_branch_revisions", "boolean", "a revision that is a branch only warns (the weights follow it)",
         parse=knobs.boolean),
    # Weights.
    Knob("hf_endpoint", "URL or None", "the Hugging Face hub to use; None: the public hub", subject="weights",
         https_unless=("allow_http_hub", "the token travels in clear; whoever is on the path serves the weights and "
                       "the hashes they are checked against")),
    Knob("allow_http_hub", "boolean", "accept a plain-HTTP hf_endpoint (the token then travels in clear)",
         subject="weights", parse=knobs.boolean),
    Knob("hf_token_env", "variable name", "the controller's variable holding the HF token", subject="weights",
         parse=_VARIABLE),
    Knob("weights_dir", "path", "a directory per repo, in it one per revision", subject="weights", parse=knobs.path),
    Knob("verify_weights", "boolean", "hash every weights file against the hub", subject="weights",
         parse=knobs.boolean),
    Knob("weights_fanout", "boolean", "hosts of the run deploying the same revision take its files from each other, "
         "each file from the hub once (served by each host's nginx while the run's downloads go: docs/operations.md)",
         subject="weights", parse=knobs.boolean),
    Knob("weights_fanout_port", "port", "where a host serves its revisions to the run's peers", subject="weights",
         parse=_PORT),
    Knob("weights_cache", "boolean", "a host keeps serving its revisions to its peers after the run (a site cache)",
         subject="weights", parse=knobs.boolean),
    # The server.
    Knob("api_key_env", "variable name", "the controller's variable holding the API key the servers require",
         subject="server", parse=_VARIABLE),
    Knob("remove_api_key", "boolean", "remove a key left on the host when none is set", subject="server",
         parse=knobs.boolean),
    Knob("pip_index_url", "URL or None", "the package index; None: PyPI", subject="server",
         https_unless=("allow_http_index", "whoever is on the path serves the packages uv installs as root")),
    Knob("allow_http_index", "boolean", "accept a plain-HTTP pip_index_url (its packages then unchecked in transit)",
         subject="server", parse=knobs.boolean),
    Knob("service_name", "unit name", "each replica's unit is SERVICE_NAME@DEPLOYMENT-gpuGPUS", subject="server",
         parse=_UNIT),
    Knob("service_user", "user name", "the servers' system user", subject="server", parse=knobs.service_account),
    Knob("download_user", "user name", "owns the HF token and the weights it fetches; the service user only reads "
         "them", subject="server", parse=knobs.service_account),
    Knob("install_dir", "path", "virtualenvs and host-side scripts", subject="server", parse=knobs.path),
    Knob("config_dir", "path", "the units' environment files and the API key", subject="server", parse=knobs.path),
    Knob("bind_address", "IP address", "where the servers listen; beyond loopback an API key is required",
         subject="server", parse=knobs.address),
    Knob("server_ip_allow", "list of IP networks", "what each replica's unit exchanges packets with beyond loopback, "
         "its node group and the run's gateways (IPAddressAllow=); ['any'] lifts its IP access list",
         subject="server", parse=knobs.networks),
    Knob("port", "port", "each replica listens on port + the index of its lowest GPU", subject="server", parse=_PORT),
    Knob("nccl_port", "port", "each replica's TCPStore (--nccl-port) is nccl_port + the index of its lowest GPU",
         subject="server", parse=_integer(1024, 65535)),
    Knob("enable_metrics", "boolean", "SGLang's /metrics (sglang:spec_accept_length)", subject="server",
         parse=knobs.boolean),
    Knob("min_kv_tokens", "whole number or None", "the fewest tokens each replica's KV cache must hold; None: "
         "one full context of its model", subject="server", parse=_optional(_integer(1))),
    Knob("ready_timeout_s", "seconds or None", "how long a server may take to generate; None: from the weights' "
         "size", subject="server", parse=_optional(_integer(1))),
    Knob("longest_generation_s", "seconds", "the longest generation a request may take (drain and stop wait "
         "for it)", subject="server", parse=_integer(1)),
    Knob("sglang_tuning", "dict", "attention backends, mem_fraction_static, extra args and env of the class",
         group=_CLASS, subject="server"),
    # The GPUs.
    Knob("expected_gpus", "dict", "what the class's GPUs must be: names, count, memory, interconnect, driver",
         group=_CLASS, subject="gpu"),
    Knob("install_driver", "boolean", "install the open-module driver branch (reboots if it changed)",
         subject="gpu", parse=knobs.boolean),
    Knob("driver_branch", "version", "the NVIDIA driver branch install_driver installs", subject="gpu",
         parse=_integer(1)),
    Knob("nvidia_repo_url", "URL", "NVIDIA's apt repositories (driver, fabric manager, nvlsm)", subject="gpu",
         https_unless=("allow_http_nvidia_repo", "its keyring, and so every package, can be swapped on the way")),
    Knob("allow_http_nvidia_repo", "boolean", "accept a plain-HTTP nvidia_repo_url", subject="gpu",
         parse=knobs.boolean),
    Knob("gpu_smoke_timeout_s", "seconds", "how long the GPU smoke test's all-reduce may take", subject="gpu",
         parse=_integer(10)),
    # Node groups.
    Knob("node_groups", "dict", "servers spanning several hosts: tp_size, dist_init_port, socket_ifname",
         subject="nodes"),
    Knob("node_group", "name or None", "the node group this host serves in", PER_HOST, subject="nodes"),
    Knob("node_rank", "whole number or None", "this host's rank in its node group", PER_HOST, subject="nodes"),
    Knob("node_address", "IP address or None", "this host's IP on the node network", PER_HOST, subject="nodes"),
    # The gateway and its monitoring.
    Knob("gateway_requirement", "requirement", "the smg build the gateway runs", group="gateway", subject="gateway",
         parse=_GATEWAY_REQUIREMENT),
    Knob("gateway_service_name", "unit name", "the gateway's unit", group="gateway", subject="gateway", parse=_UNIT),
    Knob("gateway_user", "user name", "the gateway's system user", group="gateway", subject="gateway",
         parse=knobs.service_account),
    Knob("gateway_bind_address", "IP address", "where clients reach the gateway", group="gateway",
         subject="gateway", parse=_matching(network.ADDRESS, "an IP address or a host name")),
    Knob("gateway_admin_key_env", "variable name", "the controller's variable holding the control plane's key",
         group="gateway", subject="gateway", parse=_VARIABLE),
    Knob("gateway_port", "port", "the gateway's port", group="gateway", subject="gateway", parse=_PORT),
    Knob("gateway_prometheus_port", "port", "smg's Prometheus port (loopback)", group="gateway", subject="gateway",
         parse=_PORT),
    Knob("gateway_policy", "name", "smg's routing policy", group="gateway", subject="gateway",
         parse=_matching(re.compile(r"[a-z_]+"), "an smg policy name (e.g. cache_aware)")),
    Knob("gateway_health", "dict", "smg's worker health checks", group="gateway", subject="gateway"),
    Knob("gateway_register_timeout_s", "seconds", "how long a registered worker may take to be ready",
         group="gateway", subject="gateway", parse=_integer(1)),
    Knob("gateway_worker_address", "address or None", "where the gateway reaches this worker; None: ssh_hostname",
         PER_HOST, group="", subject="gateway"),
    Knob("prometheus_listen_address", "IP address", "where Prometheus listens", group="gateway", subject="gateway",
         parse=_matching(network.ADDRESS, "a host name or IPv4 address")),
    Knob("prometheus_port", "port", "Prometheus's port", group="gateway", subject="gateway", parse=_PORT),
    Knob("prometheus_scrape_interval_s", "seconds", "how often Prometheus scrapes", group="gateway",
         subject="gateway", parse=_integer(1, 3600)),
    Knob("prometheus_retention", "duration", "how long Prometheus keeps samples", group="gateway",
         subject="gateway",
         parse=_matching(re.compile(r"[1-9][0-9]*(h|d|w|y)"), "a duration such as 15d, 12h, 2w or 1y")),
    Knob("prometheus_targets_timeout_s", "seconds", "how long the deploy waits for every target's first scrape",
         group="gateway", subject="gateway", parse=_integer(1, 3600)),
    # The serving benchmark (bench.py; serving_benchmark/plan.py reads them). No group file sets them.
    Knob("modes", "list or None", "comma-separated modes to sweep; None: every mode the algorithm table has",
         group="", subject="bench"),
    Knob("concurrency", "list", "comma-separated concurrency levels", group="", subject="bench", default="1,4,16,64",
         parse=knobs.levels),
    Knob("requests", "whole number or None", "requests per level; None: max(16, 4 x concurrency)", group="",
         subject="bench", parse=_optional(_integer(1))),
    Knob("prompts", "path or None", "a JSON-lines prompts file on the controller; None: the shipped prompts",
         group="", subject="bench"),
    Knob("output_tokens", "whole number", "tokens generated per request", group="", subject="bench", default=256,
         parse=_integer(1)),
    Knob("bench_tokenizer", "name or path", "'target' (the model's own) or a controller directory with "
         "tokenizer.json", group="", subject="bench"),
    Knob("results_dir", "directory", "where results are written on the controller", group="", subject="bench",
         default="bench-results",
         parse=lambda name, value: knobs.matching(name, str(value), re.compile(r"[A-Za-z0-9._/-]+"),
                                                  "a relative or absolute directory name")),
    Knob("baseline", "path or None", "an earlier run's summary.json to compare against", group="",
         subject="bench"),
    Knob("max_throughput_drop", "fraction", "the largest throughput drop from the baseline that passes",
         group="", subject="bench", default=0.10, parse=knobs.fraction),
    Knob("max_accept_drop", "number", "the largest accept-length drop from the baseline that passes",
         group="", subject="bench", default=0.2, parse=knobs.number),
    Knob("each_replica", "boolean", "with several replicas, each level runs on every replica alone before all of "
         "them at once; false: all at once only (a host's figures in one pass, not one per replica)", group="",
         subject="bench", default=True, parse=knobs.boolean),
    # The tuner (tune.py; tuning/plan.py reads them, with the benchmark's workload and levels above).
    Knob("objective", "name", "what the tuner's pick is best at: throughput, latency or energy",
         group="", subject="tune", default="throughput"),
    Knob("search", "name", "walk (the fewest trials that find the best) or grid (every candidate)",
         group="", subject="tune", default="walk"),
    Knob("algorithms", "list or None", "comma-separated algorithms the tuner compares, as the bench names its modes "
         "(serving_benchmark/plan.py parses them); None: every one a profile of the deployed model serves",
         group="", subject="tune"),
    Knob("max_tpot_ms", "number or None", "the slowest time per output token the tuner's pick may have",
         group="", subject="tune", parse=_optional(functools.partial(knobs.number, minimum=0.001))),
    Knob("max_ttft_ms", "number or None", "the longest time to first token the tuner's pick may have",
         group="", subject="tune", parse=_optional(functools.partial(knobs.number, minimum=0.001))),
    # status.py, logs.py, uninstall.py (--data).
    Knob("json", "boolean", "status.py prints its records as one JSON list on stdout", (DATA,), group="",
         subject="tools"),
    Knob("lines", "whole number", "logs.py: journal lines per unit (default 100)", (DATA,), group="", subject="tools"),
    Knob("follow", "boolean", "logs.py keeps printing new lines", (DATA,), group="", subject="tools"),
    Knob("replica", "unit name", "logs.py: which unit's journal (one of the host's units); default every unit",
         (DATA,), group="", subject="tools"),
    Knob("remove_weights", "boolean", "uninstall.py removes the weights too", (DATA,), group="", subject="tools"),
    # Refused by the subject named, with the sentence saying what replaced them; known, so that sentence is said.
    *(Knob(name, "retired", instead, group="", subject="retired", parse=_retired, refused_by=by)
      for name, by, instead in (
        ("input_tokens", "bench", "the prompts' own lengths count: give a prompts file (prompts=FILE, JSON lines "
         "with a \"text\" each)"),
        ("force", "bench", "a worker behind a gateway is drained from it before its sweep and registered again "
         "after"),
        ("gpu_smoke_engine", "gpu", "the GPU smoke test always runs torch.distributed with NCCL from the SGLang "
         "venv; remove it"))),
)
BY_NAME = {knob.name: knob for knob in KNOBS}
SECTIONS = {"deployment": "What is deployed", "weights": "Weights", "server": "The SGLang servers",
            "gpu": "The GPUs", "nodes": "Node groups", "gateway": "The gateway and Prometheus",
            "bench": "The serving benchmark (bench.py)", "tune": "The tuner (tune.py)",
            "tools": "status.py, logs.py, uninstall.py", "retired": "Retired (refused, saying what replaced them)"}


def value(data: Any, name: str) -> Any:
    """The knob `name`'s value in `data` (pyinfra's host data, or a mapping), parsed by its declaration; where the
    data has none, its declared default. A bad value raises BadHostData naming the knob.

    >>> value({"port": "30010"}, "port")
    30010
    """
    knob = BY_NAME[name]
    raw = _raw(data, name)
    raw = knob.default if raw is None else raw
    if knob.https_unless:
        allow, risk = knob.https_unless
        return knobs.url_over_https(name, raw, allow, _raw(data, allow), risk)
    return raw if knob.parse is None else knob.parse(name, raw)


def _raw(data: Any, name: str) -> Any:
    return data.get(name) if callable(getattr(type(data), "get", None)) else getattr(data, name, None)


def refuse_retired(data: Any, subject: str) -> None:
    """Raise BadHostData, saying what replaced it, for a retired knob that `subject` refuses and `data` sets."""
    for knob in KNOBS:
        if knob.refused_by == subject:
            value(data, knob.name)


@functools.cache
def _pyinfra_keys() -> frozenset[str]:
    """The data keys pyinfra itself reads: its operations' global arguments (_sudo, ...) and each connector's
    (ssh_hostname, ssh_user, ...)."""
    from pyinfra.api.arguments import all_global_arguments
    from pyinfra.api.connectors import get_all_connectors

    return frozenset([name for name, _ in all_global_arguments()] +
                     [key for connector in get_all_connectors().values() for key in (connector.data_meta or {})])


class UnknownKnob(SystemExit):
    """A key no layer may set where it was set: stops the run before anything changes, in one line."""


def problem(key: str, layer: str, where: str) -> str | None:
    """The line refusing `key` as set by `layer` at `where` (e.g. 'SITE/group_data/all.py'), or None if it may be."""
    knob = BY_NAME.get(key)
    if knob is None:
        if key.startswith("_") or key in _pyinfra_keys():
            return None  # pyinfra's own (_sudo, ssh_user, ...), or a group file's private helper
        near = difflib.get_close_matches(key, list(BY_NAME), n=1, cutoff=0.6)
        hint = f": did you mean `{near[0]}`?" if near else ""
        return f"{where} sets `{key}`, which is no knob of specfleet{hint} (docs/configuration.md lists every knob)"
    if layer not in knob.layers:
        return f"{where} sets `{key}`, which {layer} may not set: set it in {' or '.join(knob.layers)}"
    return None


def refused(values: dict, layer: str, where: str) -> list[str]:
    """One line for each key of `values` that `layer` may not set (functions and modules are helpers, not keys)."""
    return [line for key, value in values.items()
            if not isinstance(value, (types.FunctionType, types.ModuleType, type))
            for line in [problem(key, layer, where)] if line]


def check(values: dict, layer: str, where: str) -> None:
    """Stop (UnknownKnob) at the first key of `values` that `layer` may not set."""
    lines = refused(values, layer, where)
    if lines:
        raise UnknownKnob(lines[0])


def cli_data(items: list[str]) -> dict:
    """pyinfra's --data KEY=VALUE options as its CLI reads them (the DATA layer of pin.py and rollout.py)."""
    from pyinfra_cli.util import parse_cli_arg

    return {key: parse_cli_arg(value) for key, _, value in (item.partition("=") for item in items)}


_checked: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # inventory -> its first refusal, or ""


def check_inventory(inventory) -> None:
    """Stop the run (UnknownKnob, one line) at the first key of the inventory's --data, host data or group
    data that no knob allows there; checked once per inventory (each host's deploy file asks)."""
    if inventory not in _checked:
        lines = refused(inventory.get_override_data(), DATA, "--data")
        for name, data in inventory.group_data.items():
            lines += refused(data, GROUP, f"group data of group `{name}`")
        for name, data in inventory.host_data.items():
            lines += refused(data, HOST, f"inventory data of host {name}")
        _checked[inventory] = lines[0] if lines else ""
    if _checked[inventory]:
        raise UnknownKnob(_checked[inventory])


def deploy_data_refused(data: dict) -> str | None:
    """Why a deploy refuses its --data `data`, one line, when it sets what a host serves (else None): --data
    lasts one run, after which status.py, tests/deployed and the gateways, which read the inventory and the
    site's group data, would disagree with the host. The site directory holds that choice for every command."""
    served = [key for key in data if key in BY_NAME and BY_NAME[key].serves]
    if not served:
        return None
    return (f"--data sets `{served[0]}`, which says what a host serves: a deploy's --data lasts one run, after which "
            "status.py, tests/deployed and the gateways would disagree with the host; set it in "
            "SPECFLEET_SITE/group_data/<group>.py (or the inventory's host data) instead")
