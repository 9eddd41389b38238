"""What the tuner shows and keeps, pure (figures in, text and files out): each trial's figures from the serving
benchmark's level results, the GPUs' power draw from nvidia-smi's samples, the table of every trial with its
speedup over autoregressive decoding, the comparison of the algorithms at each concurrency (the winner, each
algorithm's best, its speedup over autoregressive decoding measured in the same run, its accept length), the
plot of throughput against one request's speed with the pick marked, and the figures the tuned file keeps."""

import importlib.util
import json
from pathlib import Path

from deployment.server import speculative
from serving_benchmark.report import STAND_IN_LABEL
from tuning.search import Figures, Result, Trial

COLUMNS = ("#", "settings", "output tok/s", "TTFT ms", "TPOT ms", "accept length", "tokens/J",
           f"speedup over {speculative.AR.name}")


def figures(concurrency: int, level: dict, power_w: float | None) -> Figures:
    """One level of a trial from the bench's level result (serving_benchmark/report.py level_result)."""
    return Figures(concurrency, throughput=level.get("output_tok_s") or 0.0,
                   ttft_ms=(level.get("ttft_ms") or {}).get("avg") or 0.0,
                   tpot_ms=(level.get("tpot_ms") or {}).get("avg") or 0.0,
                   accept_length=level.get("accept_length"), power_w=power_w)


def power(samples: str, gpus: int) -> float | None:
    """The GPUs' mean power draw, watts, from `nvidia-smi --query-gpu=power.draw --format=csv,noheader,nounits
    -lms N` over `gpus` GPUs (a line per GPU per sample); None where it reads none ("[N/A]", no samples)."""
    values = []
    for line in filter(None, (line.strip() for line in samples.splitlines())):
        try:
            values.append(float(line))
        except ValueError:  # "[N/A]": this GPU's power is not readable
            return None
    whole = len(values) // gpus * gpus
    if not whole:
        return None
    return sum(values[:whole]) / (whole // gpus)


def _fmt(value, digits=1) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def _times(ratio: float | None) -> str:
    return "-" if ratio is None else f"{ratio:.2f}x"


def table(result: Result, labels: list[str]) -> str:
    """Every trial at the objective's level, in the order run (`labels`: each trial's settings in words), the
    pick marked; a trial that stopped early is said so."""
    c = result.objective.concurrency
    heading = f"objective: {result.objective.name} at concurrency {c}; {len(result.trials)} trials of a grid of {result.grid}"
    lines = [heading, "| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for number, ((point, trial), label) in enumerate(zip(result.trials, labels), 1):
        f = trial.levels.get(c)
        chosen = result.winner is not None and result.winner[0] is point
        speedup = result.speedup(trial)
        note = " (stopped early)" if trial.stopped else " (PICK)" if chosen else ""
        lines.append(f"| {number} | {label}{note} | {_fmt(f and f.throughput)} | {_fmt(f and f.ttft_ms)} | "
                     f"{_fmt(f and f.tpot_ms, 2)} | {_fmt(f and f.accept_length, 2)} | "
                     f"{_fmt(f and f.tokens_per_joule, 3)} | {_times(speedup)} |")
    return "\n".join(lines)


def compared(result: Result) -> dict[int, list[dict]]:
    """Per concurrency measured, each algorithm's best trial that meets the limits there, best first (the
    winner), on the objective read at that level: its trial's number, figure, speedup over the baseline at
    that level, accept length. Trials a walk did not measure at a level are not there (a trial stopped early
    has the objective's level alone)."""
    o, base = result.objective, result.baseline
    levels = sorted({c for _, t in result.trials for c in t.levels})
    found = {}
    for c in levels:
        best: dict[str, tuple[int, float]] = {}
        for number, (point, trial) in enumerate(result.trials, 1):
            figure = o.value(trial, c)
            if figure is None or not o.meets(trial, c):
                continue
            if point.algorithm not in best or figure > best[point.algorithm][1]:
                best[point.algorithm] = (number, figure)
        reference = o.value(base[1], c) if base else None
        rows = []
        for algorithm, (number, figure) in sorted(best.items(), key=lambda item: -item[1][1]):
            f = result.trials[number - 1][1].levels[c]
            rows.append({"algorithm": algorithm, "trial": number, o.name: figure,
                         "speedup": figure / reference if reference else None, "accept_length": f.accept_length})
        found[c] = rows
    return found


def comparison(result: Result, labels: list[str]) -> str:
    """The algorithms side by side at each concurrency (`compared`): the winner named with its settings, then
    each algorithm's best with its speedup over autoregressive decoding measured in this run."""
    o, lines = result.objective, []
    unit = {"throughput": "output tok/s", "latency": "tok/s a request", "energy": "tokens/J"}[o.name]
    for c, rows in compared(result).items():
        if not rows:
            lines += [f"concurrency {c}: no trial meets the limits", ""]
            continue
        lines += [f"concurrency {c}: {rows[0]['algorithm']} wins ({labels[rows[0]['trial'] - 1]}, #{rows[0]['trial']})",
                  f"| algorithm | best of its trials | {unit} | speedup over {speculative.AR.name} | accept length |",
                  "|---|---|---|---|---|"]
        lines += [f"| {r['algorithm']} | #{r['trial']} {labels[r['trial'] - 1]} | "
                  f"{_fmt(r[o.name], 3 if o.name == 'energy' else 1)} | {_times(r['speedup'])} | "
                  f"{_fmt(r['accept_length'], 2)} |" for r in rows]
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def kept(result: Result, labels: list[str], settings: list[dict], how: str) -> dict:
    """The figures a tuned file keeps: the objective and its limits, the search, and every trial (settings,
    each level's figures, whether it stopped early), the pick's and the baseline's among them."""
    def trial_of(trial: Trial) -> dict:
        return {str(c): {"output_tok_s": f.throughput, "ttft_ms": f.ttft_ms, "tpot_ms": f.tpot_ms,
                         "accept_length": f.accept_length, "tokens_per_joule": f.tokens_per_joule}
                for c, f in trial.levels.items()}
    o = result.objective
    return {"objective": o.name, "concurrency": o.concurrency, "max_tpot_ms": o.max_tpot_ms,
            "max_ttft_ms": o.max_ttft_ms, "search": how, "grid": result.grid,
            # The pick's number in trials.md's table (1 for the first trial), as the table marks it.
            "pick": next((number for number, (p, _) in enumerate(result.trials, 1)
                          if result.winner and p is result.winner[0]), None),
            "trials": [{"label": label, "settings": s, "levels": trial_of(t), "stopped": t.stopped,
                        "speedup": result.speedup(t)}
                       for (_, t), label, s in zip(result.trials, labels, settings)],
            # Per concurrency, each algorithm's best (best first: the winner there), as `comparison` shows it.
            "algorithms": {str(c): rows for c, rows in compared(result).items()}}


def plot(result: Result, labels: list[str], out: Path, title: str, stand_in: bool) -> Path | None:
    """tune.png: each trial's host throughput against one request's decode speed at the objective's level, the
    pick marked; None without matplotlib (requirements-dev.txt), as the bench's plots."""
    if importlib.util.find_spec("matplotlib") is None:
        return None
    import matplotlib
    matplotlib.use("Agg")
    from matplotlib import pyplot

    c = result.objective.concurrency
    figure, axes = pyplot.subplots(figsize=(6.4, 4.6), dpi=100)
    drawn = [(number, point, trial.levels[c], label) for number, ((point, trial), label)
             in enumerate(zip(result.trials, labels), 1) if c in trial.levels and not trial.stopped]
    middle = (min(f.request_speed for _, _, f, _ in drawn) + max(f.request_speed for _, _, f, _ in drawn)) / 2 \
        if drawn else 0
    for number, point, f, label in drawn:
        chosen = result.winner is not None and result.winner[0] is point
        axes.scatter(f.request_speed, f.throughput, marker="*" if chosen else "o", s=160 if chosen else 30,
                     color="tab:red" if chosen else ("tab:gray" if point.baseline else "tab:blue"), zorder=3)
        # Every trial by its number in trials.md; the pick and the baseline by their settings too. A label
        # right of the middle runs leftwards, so none leaves the axes.
        right = f.request_speed > middle
        axes.annotate(f"#{number} {label}" if chosen or point.baseline else f"#{number}",
                      (f.request_speed, f.throughput), fontsize=7, xytext=(-5 if right else 5, 4),
                      textcoords="offset points", ha="right" if right else "left")
    axes.set_xlabel(f"one request's decode speed, tokens/s (concurrency {c})")
    axes.set_ylabel("output tokens/s, the host")
    axes.set_title(title + (f"\n{STAND_IN_LABEL}" if stand_in else ""), fontsize=8)
    axes.grid(True, alpha=0.3)
    figure.tight_layout()
    path = out / "tune.png"
    figure.savefig(path)
    pyplot.close(figure)
    return path


def markdown(result: Result, labels: list[str], title: str, stand_in: bool, left_out: list[str]) -> str:
    """trials.md: a heading, the stand-in's label where its speed model answered (as the bench's summary.md),
    the algorithms compared at each concurrency, the table, and each candidate left out before any trial with
    its reason."""
    lines = [f"# Tuning trials: {title}", "", *([f"**{STAND_IN_LABEL}.**", ""] if stand_in else []),
             "## The algorithms at each concurrency", "", comparison(result, labels), "## Every trial", "",
             table(result, labels)]
    if left_out:
        lines += ["", f"## Left out before any trial ({len(left_out)})", "", *(f"- {line}" for line in left_out)]
    return "\n".join(lines) + "\n"


def write(result: Result, labels: list[str], settings: list[dict], how: str, out: Path, title: str,
          stand_in: bool, left_out: list[str] = ()) -> list[Path]:
    """trials.json, trials.md and tune.png (where matplotlib is installed) into `out`."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "trials.json").write_text(json.dumps(kept(result, labels, settings, how), indent=2) + "\n")
    (out / "trials.md").write_text(markdown(result, labels, title, stand_in, list(left_out)))
    drawn = plot(result, labels, out, title, stand_in)
    return [out / "trials.json", out / "trials.md", *([drawn] if drawn else [])]
