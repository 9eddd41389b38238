"""The tuner's knobs (tune.py `--data key=value`), checked before any host is touched: the serving benchmark's
workload and levels (serving_benchmark/plan.py), the objective and its limits, the search, and the site
directory the pick is written to."""

import hashlib
from dataclasses import dataclass
from pathlib import Path

from deployment import knobs, schema, site_data
from deployment.knobs import BadHostData
from serving_benchmark.plan import Plan, modes_named
from serving_benchmark.plan import plan as bench_plan
from tuning import search

# The tuner's own levels where none are asked: fewer than the benchmark's, as every trial sweeps them all.
CONCURRENCY = "1,8"


@dataclass(frozen=True)
class TunePlan:
    bench: Plan  # the workload, the levels, the results directory
    objective: search.Objective
    search: str  # one of search.SEARCHES
    site: Path  # where the pick goes: SITE/tuned/<class>/<profile>.json
    algorithms: tuple[str, ...] | None = None  # the modes compared; None: every one the model's profiles serve

    @property
    def prompts_digest(self) -> str:
        """What tells the prompts measured with from others: sha256 of the prompts file."""
        return "sha256:" + hashlib.sha256(self.bench.prompts.read_bytes()).hexdigest()


class _Data:
    """`data` with the tuner's own concurrency levels under it."""

    def __init__(self, data):
        self.data = data

    def get(self, key):
        value = self.data.get(key)
        return CONCURRENCY if value is None and key == "concurrency" else value


def plan(data) -> TunePlan:
    """The tuner's knobs of `host.data` (strings from --data, or group data), each checked: BadHostData names
    the knob, its value and what is accepted."""
    values = _Data(data)
    if data.get("modes") is not None:
        raise BadHostData(f"modes={data.get('modes')!r} is not accepted by tune.py: it compares the algorithms "
                          "the model's profiles serve; choose among them with algorithms= (bench.py takes modes)")
    bench = bench_plan(values)
    limits = {key: schema.value(data, key) for key in ("max_tpot_ms", "max_ttft_ms")}
    try:
        goal = search.objective(str(schema.value(data, "objective")), bench.concurrency, **limits)
    except ValueError as problem:
        raise BadHostData(str(problem)) from None
    how = str(schema.value(data, "search"))
    if how not in search.SEARCHES:
        raise knobs.refused("search", how, f"use one of {', '.join(search.SEARCHES)}")
    where = site_data.directory()
    if where is None:
        raise BadHostData(f"tune.py writes its pick to SITE/tuned/CLASS/PROFILE.json: export {site_data.SITE_ENV}=DIR "
                          "(your site directory, outside this checkout)")
    asked = schema.value(data, "algorithms")
    return TunePlan(bench=bench, objective=goal, search=how, site=where,
                    algorithms=None if asked is None else modes_named("algorithms", asked))
