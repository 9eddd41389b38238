"""LAB STAND-IN for `sglang.srt.server_args`: the real 0.5.23 parser, rebuilt.

`ServerArgs.add_cli_args(parser)` adds the flags that extract_flags.py dumped
from the real release, so `ServerArgs.add_cli_args` + `parse_args` accepts and
rejects exactly what the real parser does (unknown flags, bad choices, bad
types: argparse's exit 2 and message). The types and actions below copy the
real ones by name, because argparse puts the type's name in its messages.
"""

import argparse
import json
import logging
import re
from decimal import Decimal
from importlib import resources

import sglang

logger = logging.getLogger(__name__)


def loads(value):  # the real flags use json.loads itself
    return json.loads(value)


def nullable_str(value):
    return None if not value or value == "None" else value


def human_readable_int(value):
    """An int with an optional SI (k, M, G, T) or IEC (Ki, Mi, Gi, Ti) suffix."""
    value = value.strip()
    match = re.fullmatch(r"(\d+(?:\.\d+)?)(Ki|Mi|Gi|Ti|k|M|G|T)", value)
    if match:
        number, suffix = match.groups()
        if suffix.endswith("i"):
            if "." in number:
                raise argparse.ArgumentTypeError(
                    f"Decimals are not allowed with IEC suffixes like '{suffix}'."
                )
            return int(number) * 2 ** (10 * "KMGT".index(suffix[0]) + 10)
        return int(Decimal(number) * 10 ** (3 * "kMGT".index(suffix) + 3))
    try:
        return int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"Invalid integer value: '{value}'. Use a plain integer, SI suffixes "
            "(1k, 1M), or IEC suffixes (1Ki, 1Mi). Suffixes are case-sensitive."
        )


def json_list_type(value):
    try:
        return json.loads(value)
    except json.JSONDecodeError:
        raise argparse.ArgumentTypeError(
            f"Invalid JSON list: {value}. Please provide a valid JSON list."
        )


def parse_cuda_graph_backend_arg(raw):
    if raw == "tc_piecewise":
        raise argparse.ArgumentTypeError(
            "tc_piecewise was removed; select breakable, full, or disabled"
        )
    return raw


def parse_cuda_graph_config_arg(raw):
    try:
        parsed = json.loads(raw)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"--cuda-graph-config must be JSON: {e}")
    if not isinstance(parsed, dict):
        raise argparse.ArgumentTypeError(
            f"--cuda-graph-config must be a JSON object, got {type(parsed).__name__}"
        )
    for phase in parsed:
        if phase not in ("decode", "prefill"):
            raise argparse.ArgumentTypeError(
                f"--cuda-graph-config: unknown phase '{phase}', "
                "expected one of ('decode', 'prefill')"
            )
    return parsed


TYPES = {
    None: None,
    "str": str,
    "int": int,
    "float": float,
    "loads": loads,
    "nullable_str": nullable_str,
    "human_readable_int": human_readable_int,
    "json_list_type": json_list_type,
    "parse_cuda_graph_backend_arg": parse_cuda_graph_backend_arg,
    "parse_cuda_graph_config_arg": parse_cuda_graph_config_arg,
}


def _deprecated(option_string):
    logger.warning(f"'{option_string}' is deprecated and will be removed in a future release.")


class DeprecatedStoreTrueAction(argparse.Action):
    def __call__(self, parser, namespace, values, option_string=None):
        _deprecated(option_string)
        setattr(namespace, self.dest, True)


class DeprecatedStoreConstAction(argparse.Action):
    def __init__(self, option_strings, dest, const_value=None, **kwargs):
        self.const_value = const_value
        super().__init__(option_strings, dest, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        _deprecated(option_string)
        setattr(namespace, self.dest, self.const_value)


class LoRAPathAction(argparse.Action):
    """Keeps plain paths; JSON objects ({"lora_name", "lora_path"}) are decoded."""

    def __call__(self, parser, namespace, values, option_string=None):
        paths = [v.strip() for v in values or []]
        paths = [json.loads(p) if p.startswith("{") and p.endswith("}") else p for p in paths]
        setattr(namespace, self.dest, paths)


def flag_list() -> dict:
    """The flag list this build was made with (plain 0.5.23 or + DDTree)."""
    name = sglang.build_info()["flags"]
    return json.loads((resources.files("sglang") / name).read_text())


def _add(parser: argparse.ArgumentParser, a: dict) -> None:
    kind = a["action"]
    opts = a["option_strings"]
    common = {"dest": a["dest"], "default": a["default"], "required": a["required"]}
    if kind == "_StoreTrueAction":
        parser.add_argument(*opts, action="store_true", **common)
    elif kind == "BooleanOptionalAction":
        # The action makes the --no- spellings itself; pass only the others.
        negated = {"--no-" + o[2:] for o in opts}
        opts = [o for o in opts if o not in negated]
        parser.add_argument(*opts, action=argparse.BooleanOptionalAction, **common)
    elif kind == "DeprecatedStoreTrueAction":
        parser.add_argument(*opts, action=DeprecatedStoreTrueAction, nargs=0, **common)
    elif kind == "DeprecatedStoreConstAction":
        parser.add_argument(
            *opts,
            action=DeprecatedStoreConstAction,
            nargs=a["nargs"],
            choices=a["choices"],
            const_value=a["const_value"],
            **common,
        )
    elif kind in ("_StoreAction", "LoRAPathAction"):
        action = LoRAPathAction if kind == "LoRAPathAction" else "store"
        parser.add_argument(
            *opts,
            action=action,
            nargs=a["nargs"],
            const=a["const"],
            type=TYPES[a["type"]],
            choices=a["choices"],
            **common,
        )
    else:
        raise ValueError(f"flag list has an action the stand-in lacks: {kind}")


# The record's fields that no flag sets, with their defaults (0.5.23 server_args.py record_fields).
RECORD_ONLY_FIELDS = {
    "custom_sigquit_handler": None, "grpc_worker_threads": None, "stat_loggers": None,
    "_speculative_draft_quantization_explicitly_set": None, "uses_mamba_radix_cache": False,
    "_radix_eviction_policy_explicitly_set": False, "_swa_full_tokens_ratio_explicitly_set": None,
    "speculative_boundary_reduction": "rs+rsv", "enable_cp_tp_group_sharing": False, "watermark_key": None,
    "watermark_key_b": None, "watermark_context_window": 4, "watermark_mixing_probability": 0.5,
    "watermark_max_probability": 1.0, "watermark_default_enabled": False, "watermark_enforce_all": False,
    "aux_hidden_state_capture": None,
}


class ServerArgs:
    """The parsed arguments; `resolve_once` applies the real post-init rules (srt/resolution.py)."""

    def __init__(self, namespace: argparse.Namespace):
        self.__dict__.update(vars(namespace))

    @staticmethod
    def add_cli_args(parser: argparse.ArgumentParser) -> None:
        for a in flag_list()["actions"]:
            _add(parser, a)

    def resolve_once(self) -> None:
        from sglang.srt.resolution import resolve

        if not getattr(self, "_resolution_finished", False):
            resolve(self, ddtree_build="speculative_ddtree_budget" in self.__dict__)
            self._resolution_finished = True

    def check_server_args(self) -> None:
        from sglang.srt.resolution import check

        check(self)

    def resolved_dict(self) -> dict:
        """ServerArgs.resolved_dict: every field of the record, those no flag sets included; argparse's
        --config is no field."""
        flags = {key: value for key, value in vars(self).items() if not key.startswith("_") and key != "config"}
        return {**flags, **RECORD_ONLY_FIELDS}

    @property
    def launch_command(self) -> str | None:
        return getattr(self, "_launch_command", None)


def prepare_server_args(argv: list[str]) -> ServerArgs:
    """As the real one: `sglang serve`'s parser, the arguments unresolved, and the argv it was given as
    `launch_command` (server_args.py: joined with spaces, only --watermark-config's value redacted)."""
    parser = argparse.ArgumentParser(prog="sglang serve")
    ServerArgs.add_cli_args(parser)
    args = ServerArgs(parser.parse_args(argv))
    args._launch_command = " ".join("<redacted>" if previous == "--watermark-config" else
                                    ("--watermark-config=<redacted>" if a.startswith("--watermark-config=") else a)
                                    for previous, a in zip(["", *argv], argv))
    return args
