"""The serving benchmark's knobs (bench.py `--data key=value`, or group data), checked before any host is
touched: modes, concurrency levels, the workload, the results and the regression gate's limits."""

import difflib
import json
from dataclasses import dataclass
from pathlib import Path

from deployment import schema
from deployment.knobs import BadHostData
from deployment.server import speculative

REPO = Path(__file__).resolve().parent.parent
# The default workload: 20 prompts written for this benchmark (6 chat, 6 code, 5 reasoning and 3 long-context
# ones of 1,500-2,400 words: a module to review, a design to summarize, a server to explain), because the
# drafter's accept length depends on what is asked: random tokens tell nothing about it.
PROMPTS = REPO / "serving_benchmark" / "prompts.jsonl"


@dataclass(frozen=True)
class Plan:
    """What bench.py was asked for (`--data key=value`), validated."""

    modes: tuple[str, ...]
    concurrency: tuple[int, ...]
    requests: int | None  # per level; None: max(16, 4 x concurrency)
    prompts: Path  # JSON lines on the controller, each {"text": ...} (aiperf's single_turn dataset)
    prompt_count: int
    output_tokens: int
    tokenizer: str  # "target" (the model's own, from its weights directory) or a controller directory
    results_dir: Path
    baseline: Path | None
    max_throughput_drop: float
    max_accept_drop: float
    each_replica: bool  # with several replicas, each level on every replica alone before all of them at once

    def requests_at(self, concurrency: int) -> int:
        return self.requests or max(16, 4 * concurrency)


def plan(data) -> Plan:
    """The benchmark knobs of `host.data` (strings from --data, or group data), each parsed by its declaration
    (deployment/schema.py): a bad value raises BadHostData naming the knob, the value and what is accepted."""
    schema.refuse_retired(data, "bench")
    modes = modes_named("modes", schema.value(data, "modes") or ",".join(speculative.modes()))
    baseline = data.get("baseline")
    if baseline is not None and not Path(str(baseline)).is_file():
        raise BadHostData(f"baseline={baseline!r} is not accepted: use an earlier run's summary.json on the "
                          "controller")
    tokenizer = str(data.get("bench_tokenizer") or "target")
    if tokenizer != "target" and not (REPO / tokenizer / "tokenizer.json").is_file():
        raise BadHostData(f"bench_tokenizer={tokenizer!r} is not accepted: use 'target' or a controller directory "
                          "holding tokenizer.json")
    prompts = Path(str(data.get("prompts") or PROMPTS)).expanduser().absolute()
    return Plan(
        modes=modes, concurrency=schema.value(data, "concurrency"), requests=schema.value(data, "requests"),
        prompts=prompts, prompt_count=prompt_count(prompts),
        output_tokens=schema.value(data, "output_tokens"),
        tokenizer=tokenizer, results_dir=Path(schema.value(data, "results_dir")),
        baseline=Path(str(baseline)) if baseline is not None else None,
        max_throughput_drop=schema.value(data, "max_throughput_drop"),
        max_accept_drop=schema.value(data, "max_accept_drop"),
        each_replica=schema.value(data, "each_replica"),
    )


def modes_named(knob: str, asked) -> tuple[str, ...]:
    """A comma-separated list of the bench's modes (one per algorithm of deployment/server/speculative.py), each
    once, in the order given: bench.py's `modes`, tune.py's `algorithms`. A name no mode has is refused in one
    line, with the nearest mode."""
    known = speculative.modes()
    modes = tuple(dict.fromkeys(str(asked).replace(" ", "").split(",")))
    wrong = next((mode for mode in modes if mode not in known), None)
    if wrong is not None:
        near = difflib.get_close_matches(wrong, known, n=1)
        raise BadHostData(f"{knob}={asked!r} is not accepted: use a comma-separated list of {', '.join(known)}"
                          + (f" ({wrong!r}: did you mean {near[0]}?)" if near else ""))
    return modes


def prompt_count(path: Path) -> int:
    """How many prompts a prompts file holds: JSON lines, each an object with a non-empty "text" (aiperf's
    single_turn dataset; other keys of that format pass through), checked before any host is touched."""
    accepted = 'a file of JSON lines, each {"text": "..."}'
    try:
        lines = [line for line in path.read_text().splitlines() if line.strip()]
    except FileNotFoundError:
        raise BadHostData(f"prompts={str(path)!r} is not accepted: there is no such file (a relative path is "
                          f"read from the directory pyinfra runs in); use {accepted}") from None
    except (OSError, UnicodeDecodeError) as error:
        why = error.strerror if isinstance(error, OSError) and error.strerror else "it is not UTF-8 text"
        raise BadHostData(f"prompts={str(path)!r} is not accepted: {why[0].lower() + why[1:]}; use {accepted}") \
            from None
    for number, line in enumerate(lines, 1):
        try:
            prompt = json.loads(line)
        except ValueError:
            prompt = None
        if not isinstance(prompt, dict) or not isinstance(prompt.get("text"), str) or not prompt["text"].strip():
            raise BadHostData(f"prompts={str(path)!r} is not accepted: line {number} is not a JSON object with a "
                              f"non-empty \"text\": use {accepted}")
    if not lines:
        raise BadHostData(f"prompts={str(path)!r} is not accepted: it holds no prompt; use {accepted}")
    return len(lines)
