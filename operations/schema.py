"""Every knob specfleet reads, in one table: its name, type, one line of help and the layers that may set it.

The table is the validator and the reference page. `refused()` checks the keys a layer sets (shipped
group data, the site's group data, an inventory host's data, --data) before anything changes: an unknown
key is refused in one line naming it, where it was set and the nearest known key, as Ansible's
argument_specs refuses a role's unknown option. The values themselves are parsed by each subject's
`resolve` (operations/basics/knobs.py). docs/configuration.md is written from this table
(`python -m operations.schema`), each default as the shipped group file (or the benchmark's DEFAULTS)
sets it. Adding a knob is adding its entry to KNOBS.
"""

import difflib
import functools
import sys
import types
import weakref
from dataclasses import dataclass
from pathlib import Path

# Where a key may be set. GROUP: a group data file (group_data/<group>.py, an inventory's group data);
# SITE: SPECFLEET_SITE/group_data/<group>.py; HOST: an inventory host's own data; DATA: pyinfra's --data.
GROUP, SITE, HOST, DATA = "group data", "site group data", "inventory host data", "--data"
LAYERS = (GROUP, SITE, HOST, DATA)
# True of one host: its inventory entry (or --data with --limit) says it; group data holds the default. A
# site file sets a group's values, for every host in it.
PER_HOST = (GROUP, HOST, DATA)


@dataclass(frozen=True)
class Knob:
    name: str
    type: str  # as the reference page says it; the subject's resolve parses it (operations/basics/knobs.py)
    help: str  # one line
    layers: tuple[str, ...] = LAYERS
    group: str = "all"  # the group file whose value is the default (group_data/<group>.py); "bench": plan.DEFAULTS
    subject: str = "deployment"  # the section of the reference page
    serves: bool = False  # it says what a host serves: a deploy refuses it from --data (``deploy_data_refused``)


PAGE = Path(__file__).resolve().parents[1] / "docs" / "configuration.md"
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
    Knob("allow_branch_revisions", "boolean", "a revision that is a branch only warns (the weights follow it)"),
    # Weights.
    Knob("hf_endpoint", "URL or None", "the Hugging Face hub to use; None: the public hub", subject="weights"),
    Knob("allow_http_hub", "boolean", "accept a plain-HTTP hf_endpoint (the token then travels in clear)",
         subject="weights"),
    Knob("hf_token_env", "variable name", "the controller's variable holding the HF token", subject="weights"),
    Knob("weights_dir", "path", "a directory per repo, in it one per revision", subject="weights"),
    Knob("verify_weights", "boolean", "hash every weights file against the hub", subject="weights"),
    Knob("weights_fanout", "boolean", "hosts of the run deploying the same revision take its files from each other, "
         "each file from the hub once (served by each host's nginx while the run's downloads go: docs/operations.md)",
         subject="weights"),
    Knob("weights_fanout_port", "port", "where a host serves its revisions to the run's peers", subject="weights"),
    Knob("weights_cache", "boolean", "a host keeps serving its revisions to its peers after the run (a site cache)",
         subject="weights"),
    # The server.
    Knob("api_key_env", "variable name", "the controller's variable holding the API key the servers require",
         subject="server"),
    Knob("remove_api_key", "boolean", "remove a key left on the host when none is set", subject="server"),
    Knob("pip_index_url", "URL or None", "the package index; None: PyPI", subject="server"),
    Knob("allow_http_index", "boolean", "accept a plain-HTTP pip_index_url (its packages then unchecked in transit)",
         subject="server"),
    Knob("service_name", "unit name", "each replica's unit is SERVICE_NAME@DEPLOYMENT-gpuGPUS", subject="server"),
    Knob("service_user", "user name", "the servers' system user", subject="server"),
    Knob("download_user", "user name", "owns the HF token and the weights it fetches; the service user only reads "
         "them", subject="server"),
    Knob("install_dir", "path", "virtualenvs and host-side scripts", subject="server"),
    Knob("config_dir", "path", "the units' environment files and the API key", subject="server"),
    Knob("bind_address", "IP address", "where the servers listen; beyond loopback an API key is required",
         subject="server"),
    Knob("server_ip_allow", "list of IP networks", "what each replica's unit exchanges packets with beyond loopback, "
         "its node group and the run's gateways (IPAddressAllow=); ['any'] lifts its IP access list",
         subject="server"),
    Knob("port", "port", "each replica listens on port + the index of its lowest GPU", subject="server"),
    Knob("nccl_port", "port", "each replica's TCPStore (--nccl-port) is nccl_port + the index of its lowest GPU",
         subject="server"),
    Knob("enable_metrics", "boolean", "SGLang's /metrics (sglang:spec_accept_length)", subject="server"),
    Knob("min_kv_tokens", "whole number or None", "the fewest tokens each replica's KV cache must hold; None: "
         "one full context of its model", subject="server"),
    Knob("ready_timeout_s", "seconds or None", "how long a server may take to generate; None: from the weights' "
         "size", subject="server"),
    Knob("longest_generation_s", "seconds", "the longest generation a request may take (drain and stop wait "
         "for it)", subject="server"),
    Knob("sglang_tuning", "dict", "attention backends, mem_fraction_static, extra args and env of the class",
         group=_CLASS, subject="server"),
    # The GPUs.
    Knob("expected_gpus", "dict", "what the class's GPUs must be: names, count, memory, interconnect, driver",
         group=_CLASS, subject="gpu"),
    Knob("install_driver", "boolean", "install the open-module driver branch (reboots if it changed)",
         subject="gpu"),
    Knob("driver_branch", "version", "the NVIDIA driver branch install_driver installs", subject="gpu"),
    Knob("nvidia_repo_url", "URL", "NVIDIA's apt repositories (driver, fabric manager, nvlsm)", subject="gpu"),
    Knob("allow_http_nvidia_repo", "boolean", "accept a plain-HTTP nvidia_repo_url", subject="gpu"),
    Knob("gpu_smoke_timeout_s", "seconds", "how long the GPU smoke test's all-reduce may take", subject="gpu"),
    # Node groups.
    Knob("node_groups", "dict", "servers spanning several hosts: tp_size, dist_init_port, socket_ifname",
         subject="nodes"),
    Knob("node_group", "name or None", "the node group this host serves in", PER_HOST, subject="nodes"),
    Knob("node_rank", "whole number or None", "this host's rank in its node group", PER_HOST, subject="nodes"),
    Knob("node_address", "IP address or None", "this host's IP on the node network", PER_HOST, subject="nodes"),
    # The gateway and its monitoring.
    Knob("gateway_requirement", "requirement", "the smg build the gateway runs", group="gateway", subject="gateway"),
    Knob("gateway_service_name", "unit name", "the gateway's unit", group="gateway", subject="gateway"),
    Knob("gateway_user", "user name", "the gateway's system user", group="gateway", subject="gateway"),
    Knob("gateway_bind_address", "IP address", "where clients reach the gateway", group="gateway",
         subject="gateway"),
    Knob("gateway_admin_key_env", "variable name", "the controller's variable holding the control plane's key",
         group="gateway", subject="gateway"),
    Knob("gateway_port", "port", "the gateway's port", group="gateway", subject="gateway"),
    Knob("gateway_prometheus_port", "port", "smg's Prometheus port (loopback)", group="gateway", subject="gateway"),
    Knob("gateway_policy", "name", "smg's routing policy", group="gateway", subject="gateway"),
    Knob("gateway_health", "dict", "smg's worker health checks", group="gateway", subject="gateway"),
    Knob("gateway_register_timeout_s", "seconds", "how long a registered worker may take to be ready",
         group="gateway", subject="gateway"),
    Knob("gateway_worker_address", "address or None", "where the gateway reaches this worker; None: ssh_hostname",
         PER_HOST, group="", subject="gateway"),
    Knob("prometheus_listen_address", "IP address", "where Prometheus listens", group="gateway", subject="gateway"),
    Knob("prometheus_port", "port", "Prometheus's port", group="gateway", subject="gateway"),
    Knob("prometheus_scrape_interval_s", "seconds", "how often Prometheus scrapes", group="gateway",
         subject="gateway"),
    Knob("prometheus_retention", "duration", "how long Prometheus keeps samples", group="gateway",
         subject="gateway"),
    Knob("prometheus_targets_timeout_s", "seconds", "how long the deploy waits for every target's first scrape",
         group="gateway", subject="gateway"),
    # The serving benchmark (bench.py; serving_benchmark/plan.py parses them).
    Knob("modes", "list", "comma-separated modes to sweep", group="bench", subject="bench"),
    Knob("concurrency", "list", "comma-separated concurrency levels", group="bench", subject="bench"),
    Knob("requests", "whole number or None", "requests per level; None: max(16, 4 x concurrency)", group="",
         subject="bench"),
    Knob("prompts", "path or None", "a JSON-lines prompts file on the controller; None: the shipped prompts",
         group="", subject="bench"),
    Knob("output_tokens", "whole number", "tokens generated per request", group="bench", subject="bench"),
    Knob("bench_tokenizer", "name or path", "'target' (the model's own) or a controller directory with "
         "tokenizer.json", group="", subject="bench"),
    Knob("results_dir", "directory", "where results are written on the controller", group="bench",
         subject="bench"),
    Knob("baseline", "path or None", "an earlier run's summary.json to compare against", group="",
         subject="bench"),
    Knob("max_throughput_drop", "fraction", "the largest throughput drop from the baseline that passes",
         group="bench", subject="bench"),
    Knob("max_accept_drop", "number", "the largest accept-length drop from the baseline that passes",
         group="bench", subject="bench"),
    Knob("each_replica", "boolean", "with several replicas, each level runs on every replica alone before all of "
         "them at once; false: all at once only (a host's figures in one pass, not one per replica)", group="bench",
         subject="bench"),
    # The tuner (tune.py; tuning/plan.py parses them, with the benchmark's workload and levels above).
    Knob("objective", "name", "what the tuner's pick is best at: throughput (default), latency or energy",
         group="", subject="tune"),
    Knob("search", "name", "walk (default: the fewest trials that find the best) or grid (every candidate)",
         group="", subject="tune"),
    Knob("max_tpot_ms", "number or None", "the slowest time per output token the tuner's pick may have",
         group="", subject="tune"),
    Knob("max_ttft_ms", "number or None", "the longest time to first token the tuner's pick may have",
         group="", subject="tune"),
    # status.py, logs.py, uninstall.py (--data).
    Knob("json", "boolean", "status.py prints its records as one JSON list on stdout", (DATA,), group="",
         subject="tools"),
    Knob("lines", "whole number", "logs.py: journal lines per unit (default 100)", (DATA,), group="", subject="tools"),
    Knob("follow", "boolean", "logs.py keeps printing new lines", (DATA,), group="", subject="tools"),
    Knob("replica", "unit name", "logs.py: which unit's journal (one of the host's units); default every unit",
         (DATA,), group="", subject="tools"),
    Knob("remove_weights", "boolean", "uninstall.py removes the weights too", (DATA,), group="", subject="tools"),
    # Refused by their subject with the sentence saying what replaced them; known, so that sentence is said.
    Knob("input_tokens", "retired", "the prompts' own lengths count (prompts=FILE)", group="", subject="retired"),
    Knob("force", "retired", "a worker behind a gateway is drained before its sweep", group="", subject="retired"),
    Knob("gpu_smoke_engine", "retired", "the smoke test always runs torch.distributed with NCCL", group="",
         subject="retired"),
)
BY_NAME = {knob.name: knob for knob in KNOBS}
SECTIONS = {"deployment": "What is deployed", "weights": "Weights", "server": "The SGLang servers",
            "gpu": "The GPUs", "nodes": "Node groups", "gateway": "The gateway and Prometheus",
            "bench": "The serving benchmark (bench.py)", "tune": "The tuner (tune.py)",
            "tools": "status.py, logs.py, uninstall.py", "retired": "Retired (refused, saying what replaced them)"}


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


def _defaults() -> dict[str, dict]:
    """Each group file's shipped values (no site applied), and the benchmark's DEFAULTS."""
    import os
    import runpy

    from pyinfra.api import Inventory
    from pyinfra.context import ctx_inventory

    from serving_benchmark.plan import DEFAULTS

    repo = Path(__file__).resolve().parents[1]
    found = {"bench": DEFAULTS}
    site = os.environ.pop("SPECFLEET_SITE", None)  # the shipped defaults, not this machine's site
    try:
        with ctx_inventory.use(Inventory(([], {}))):  # a group file may read the inventory, as pyinfra lets it
            for path in sorted((repo / "group_data").glob("*.py")):  # all, gateway and every class
                found[path.stem] = runpy.run_path(str(path))
    finally:
        if site is not None:
            os.environ["SPECFLEET_SITE"] = site
    return found


def _default(knob: Knob, defaults: dict[str, dict]) -> str:
    if knob.group == _CLASS:
        return "per class (group_data/<class>.py)"
    if knob.group not in defaults or knob.name not in defaults[knob.group]:
        return "None"
    value = defaults[knob.group][knob.name]
    if knob.type == "dict" or isinstance(value, dict):
        return f"see group_data/{knob.group}.py"
    return f"`{value!r}`"


def page() -> str:
    """docs/configuration.md, written from KNOBS."""
    defaults = _defaults()
    lines = ["# Configuration: every knob", "",
             "Generated from `operations/schema.py` by `python -m operations.schema`; do not edit by hand.", "",
             "A knob is set, each layer over the one before: shipped group data (`group_data/<group>.py`), your "
             "site's (`SPECFLEET_SITE/group_data/<group>.py`), an inventory host's data, then `--data key=value`. "
             "A key no knob has, or one set where its layers do not allow, stops the run before anything changes, "
             "in one line naming it, where it was set and the nearest knob, once pyinfra has reached a host: pyinfra "
             "runs deploy.py only for the hosts it connects to, so where none answers it prints its own `Could not "
             "connect` alone. pyinfra's own keys (`ssh_*`, `_sudo`, "
             "...) are pyinfra's and pass. \"may be set in\": any of those layers, or the ones named. What a host "
             "serves (`profile`, `profiles`, `deployments`, `layouts`) a deploy and rollout.py refuse from `--data`, "
             "which would last one run: status.py, `pytest tests/deployed` and the gateways read the group data.", ""]
    for subject, title in SECTIONS.items():
        lines += [f"## {title}", "", "| knob | type | default | may be set in | what it does |",
                  "|---|---|---|---|---|"]
        lines += [f"| `{k.name}` | {k.type} | {_default(k, defaults)} | "
                  f"{'any' if k.layers == LAYERS else ', '.join(k.layers)} | {k.help} |"
                  for k in KNOBS if k.subject == subject]
        lines.append("")
    return "\n".join(lines)

if __name__ == "__main__":
    PAGE.write_text(page())
    print(f"wrote {PAGE.relative_to(Path.cwd()) if PAGE.is_relative_to(Path.cwd()) else PAGE}", file=sys.stderr)
