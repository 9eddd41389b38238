"""Serving benchmark results on the controller: one level's numbers, the host summary, its table,
its plots and the regression gate. Pure (files in, files out), so it is unit-tested without hosts.
"""

import importlib.util
import json
from pathlib import Path

from deployment.server.speculative import AR

STAND_IN_LABEL = "LAB STAND-IN: timings come from the stand-in's speed model, not a measurement"
PERCENTILES = ("avg", "p50", "p90", "p99")


def _stats(metric: dict | None) -> dict:
    return {p: (metric or {}).get(p) for p in PERCENTILES}


def level_result(client_export: dict, server_info: dict) -> dict:
    """One concurrency level: aiperf's profile_export_aiperf.json plus /server_info read right after it."""
    def avg(name: str):
        return (client_export.get(name) or {}).get("avg")

    states = server_info.get("internal_states") or [{}]
    return {
        "output_tok_s": avg("output_token_throughput"),
        "request_s": avg("request_throughput"),
        "requests_completed": avg("completed_request_count") or avg("request_count"),
        "request_errors": sum(e.get("count", 0) for e in client_export.get("error_summary") or []),
        "ttft_ms": _stats(client_export.get("time_to_first_token")),
        # aiperf's inter_token_latency is (latency - TTFT) / (output tokens - 1): SGLang's TPOT.
        "tpot_ms": _stats(client_export.get("inter_token_latency")),
        # Time between streamed chunks (one chunk per decode step on SGLang): SGLang's ITL.
        "itl_ms": _stats(client_export.get("inter_chunk_latency")),
        "e2e_ms": _stats(client_export.get("request_latency")),
        "accept_length": states[0].get("avg_spec_accept_length"),
    }


def summary(meta: dict, modes: dict) -> dict:
    """The host's summary: `meta` (host, class, profile, versions, GPUs, commit, client, workload)
    and per mode its server arguments and levels, or why it was skipped or failed."""
    stand_in = any("lab_speed_model" in m.get("server_info", {}) for m in modes.values())
    doc = {**meta, "stand_in": stand_in, "modes": {}}
    if stand_in:
        doc["note"] = STAND_IN_LABEL
    for mode, result in modes.items():
        entry = {k: v for k, v in result.items() if k != "server_info"}
        if "server_info" in result:
            entry["sglang_version"] = result["server_info"].get("version")
            if "lab_speed_model" in result["server_info"]:
                entry["lab_speed_model"] = result["server_info"]["lab_speed_model"]
        doc["modes"][mode] = entry
    versions = {m["sglang_version"] for m in doc["modes"].values() if m.get("sglang_version")}
    doc["sglang_version"] = versions.pop() if len(versions) == 1 else sorted(versions) or None
    return doc


def _fmt(value, digits=1) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def _workload(workload: dict) -> str:
    """The workload in words: the prompts file and how many, or the fixed lengths of an earlier run."""
    if "prompts" in workload:
        return f"{workload['prompt_count']} prompts of {workload['prompts']}, {workload['output_tokens']} output tokens"
    return f"{workload.get('input_tokens')} input / {workload['output_tokens']} output tokens"


# Why a speculative mode's ITL sits above plain decoding's while its TPOT falls: SGLang streams one chunk per decode step,
# and a speculative step's chunk carries every token its verify accepted (the accept length, on average).
ITL_NOTE = ("ITL is the time between streamed chunks, one a decode step: a speculative mode's chunk carries the "
            "several tokens its step accepted, so its ITL is above plain decoding's while its TPOT (the time a token) is below.")


def markdown(doc: dict) -> str:
    """A Markdown table of the summary: one row per mode and concurrency."""
    lines = [f"# Serving benchmark: {doc['host']} ({doc['host_class']}, profile {doc['profile']})", ""]
    if doc["stand_in"]:
        lines += [f"**{STAND_IN_LABEL}.**", ""]
    lines += [f"SGLang {doc['sglang_version']}, client {doc['client']}, specfleet {doc['specfleet_commit']}, "
              f"{_workload(doc['workload'])}, "
              f"started {doc['started']}.", ""]
    if doc.get("replicas"):
        lines += [f"Layout: {len(doc['replicas'])} replicas at TP {doc['layout']['tp_size']}. Below: all of them at "
                  "once (the client spreading requests round robin over them); then each replica alone.", ""]
    lines += ["| mode | concurrency | output tok/s | speedup vs ar | request/s | TTFT p50 ms | TTFT p99 ms "
              "| TPOT p50 ms | ITL p50 ms | ITL p99 ms | accept length |",
              "|---|---|---|---|---|---|---|---|---|---|---|"]
    ar = doc["modes"].get(AR.mode, {}).get("levels", {})
    for mode, entry in doc["modes"].items():
        if "levels" not in entry:
            lines.append(f"| {mode} | {entry.get('skipped') or entry.get('failed')} |||||||||| ")
            continue
        for level, r in entry["levels"].items():
            base = (ar.get(level) or {}).get("output_tok_s")
            speedup = r["output_tok_s"] / base if base and r["output_tok_s"] else None
            lines.append(f"| {mode} | {level} | {_fmt(r['output_tok_s'])} | "
                         f"{_fmt(speedup, 2) + 'x' if speedup else '-'} | {_fmt(r['request_s'], 2)} | "
                         f"{_fmt(r['ttft_ms']['p50'])} | {_fmt(r['ttft_ms']['p99'])} | {_fmt(r['tpot_ms']['p50'], 2)} | "
                         f"{_fmt(r['itl_ms']['p50'], 2)} | {_fmt(r['itl_ms']['p99'], 2)} | "
                         f"{_fmt(r['accept_length'], 2)} |")
    if any(mode != AR.mode and "levels" in entry for mode, entry in doc["modes"].items()):
        lines += ["", ITL_NOTE]
    lines += side_by_side(doc)
    if doc.get("replicas"):
        lines += ["", "| replica | mode | concurrency | output tok/s | request/s | TTFT p50 ms | accept length |",
                  "|---|---|---|---|---|---|---|"]
        for replica, modes in doc["replicas"].items():
            for mode, entry in modes.items():
                for level, r in entry["levels"].items():
                    lines.append(f"| {replica} | {mode} | {level} | {_fmt(r['output_tok_s'])} | "
                                 f"{_fmt(r['request_s'], 2)} | {_fmt(r['ttft_ms']['p50'])} | "
                                 f"{_fmt(r['accept_length'], 2)} |")
    for name, entry in (doc.get("gateways") or {}).items():
        lines += ["", f"## Through the gateway {name}", ""]
        if "url" in entry:
            lines += [f"The deployed {entry['mode']} at {entry['url']}, with the API key: the gateway's policy "
                      "spreads the requests over the replicas, as clients get them.", ""]
        if entry.get("skipped") or entry.get("failed"):
            lines += [entry.get("skipped") or entry.get("failed"), ""]
        if entry.get("levels"):
            lines += ["| concurrency | output tok/s | request/s | TTFT p50 ms | TTFT p99 ms | TPOT p50 ms "
                      "| ITL p50 ms | accept length |", "|---|---|---|---|---|---|---|---|"]
            lines += [f"| {level} | {_fmt(r['output_tok_s'])} | {_fmt(r['request_s'], 2)} "
                      f"| {_fmt(r['ttft_ms']['p50'])} | {_fmt(r['ttft_ms']['p99'])} | {_fmt(r['tpot_ms']['p50'], 2)} "
                      f"| {_fmt(r['itl_ms']['p50'], 2)} | {_fmt(r['accept_length'], 2)} |"
                      for level, r in entry["levels"].items()]
        if entry.get("generated_tokens"):
            lines += ["", "Tokens each replica generated meanwhile: "
                      + ", ".join(f"{replica} {n}" for replica, n in entry["generated_tokens"].items()) + "."]
    return "\n".join(lines) + "\n"


def side_by_side(doc: dict) -> list[str]:
    """The modes measured side by side, a column each: per concurrency each one's output tok/s, its speedup over
    ar and its accept length, the best of the row in bold; [] for fewer than two modes measured."""
    measured = {mode: e["levels"] for mode, e in doc["modes"].items() if e.get("levels")}
    if len(measured) < 2:
        return []
    ar = measured.get(AR.mode, {})
    lines = ["", "Side by side: output tok/s (speedup over ar, accept length); the best of each level in bold.", "",
             "| concurrency | " + " | ".join(measured) + " |", "|---|" + "---|" * len(measured)]
    for level in sorted({c for levels in measured.values() for c in levels}, key=int):
        row = {mode: levels.get(level) for mode, levels in measured.items()}
        best = max((r["output_tok_s"] or 0 for r in row.values() if r), default=0)
        cells = []
        for r in row.values():
            if not r:
                cells.append("-")
                continue
            base = (ar.get(level) or {}).get("output_tok_s")
            cell = (f"{_fmt(r['output_tok_s'])} ({_fmt(r['output_tok_s'] / base, 2) + 'x' if base and r['output_tok_s'] else '-'}, "
                    f"{_fmt(r['accept_length'], 2)})")
            cells.append(f"**{cell}**" if best and r["output_tok_s"] == best else cell)
        lines.append(f"| {level} | " + " | ".join(cells) + " |")
    return lines


def plots(doc: dict, out: Path) -> list[Path]:
    """throughput.png, speedup.png, accept_length.png: per mode against concurrency."""
    import matplotlib
    matplotlib.use("Agg")
    from matplotlib import pyplot

    measured = {mode: e["levels"] for mode, e in doc["modes"].items() if e.get("levels")}
    ar = measured.get(AR.mode, {})
    title = f"{doc['host']} · {doc['profile']}" + ("\nLAB STAND-IN speed model, not a measurement"
                                                   if doc["stand_in"] else "")
    charts = {
        "throughput.png": ("output tokens/s", lambda mode, c, r: r["output_tok_s"]),
        "speedup.png": ("output throughput / ar", lambda mode, c, r: (
            r["output_tok_s"] / ar[c]["output_tok_s"] if ar.get(c, {}).get("output_tok_s") else None)),
        "accept_length.png": ("accept length (tokens per verify step)", lambda mode, c, r: r["accept_length"]),
    }
    written = []
    for name, (ylabel, value) in charts.items():
        figure, axes = pyplot.subplots(figsize=(6.4, 4.2), dpi=100)
        for mode, levels in measured.items():
            points = [(int(c), value(mode, c, r)) for c, r in levels.items()]
            points = [(c, v) for c, v in points if v is not None]
            if points:
                axes.plot(*zip(*points), marker="o", label=mode)
        axes.set_xscale("log", base=2)
        levels = sorted({int(c) for lv in measured.values() for c in lv})
        axes.set_xticks(levels, [str(c) for c in levels])
        axes.minorticks_off()
        axes.set_xlabel("concurrency (requests in flight)")
        axes.set_ylabel(ylabel)
        axes.set_title(title, fontsize=9)
        axes.grid(True, alpha=0.3)
        axes.legend()
        figure.tight_layout()
        figure.savefig(out / name)
        pyplot.close(figure)
        written.append(out / name)
    return written


def regressions(doc: dict, baseline: dict, max_throughput_drop: float = 0.10,
                max_accept_drop: float = 0.2) -> list[dict]:
    """What got worse than `baseline` (a summary of the same class and profile) beyond the limits.

    Raises ValueError when the baseline is of another class or profile, or shares no level.
    """
    for key in ("host_class", "profile"):
        if baseline.get(key) != doc.get(key):
            raise ValueError(f"the baseline is for {key} {baseline.get(key)!r}, this run is {doc.get(key)!r}: "
                             f"compare runs of the same class and profile")
    worse, compared = [], 0
    for mode, levels, old_levels in _compared(doc, baseline):
        for level, new in levels.items():
            old = old_levels.get(level)
            if not old:
                continue
            compared += 1
            if old.get("output_tok_s") and (new["output_tok_s"] or 0) < old["output_tok_s"] * (1 - max_throughput_drop):
                worse.append({"mode": mode, "concurrency": level, "metric": "output tok/s",
                              "baseline": old["output_tok_s"], "now": new["output_tok_s"],
                              "change": f"{(new['output_tok_s'] or 0) / old['output_tok_s'] - 1:+.1%}",
                              "limit": f"-{max_throughput_drop:.0%}"})
            if old.get("accept_length") is not None and new["accept_length"] is not None \
                    and new["accept_length"] < old["accept_length"] - max_accept_drop:
                worse.append({"mode": mode, "concurrency": level, "metric": "accept length",
                              "baseline": old["accept_length"], "now": new["accept_length"],
                              "change": f"{new['accept_length'] - old['accept_length']:+.2f}",
                              "limit": f"-{max_accept_drop}"})
    if not compared:
        raise ValueError("the baseline has none of this run's modes and concurrency levels")
    return worse


def _compared(doc: dict, baseline: dict):
    """(mode, this run's levels, the baseline's levels) per mode, then per gateway both runs went through
    (its mode named `MODE via GATEWAY`)."""
    for mode, entry in doc["modes"].items():
        yield mode, entry.get("levels", {}), baseline.get("modes", {}).get(mode, {}).get("levels", {})
    for name, entry in (doc.get("gateways") or {}).items():
        old = (baseline.get("gateways") or {}).get(name, {})
        if entry.get("levels") and old.get("levels"):
            yield f"{entry['mode']} via {name}", entry["levels"], old["levels"]


def regression_table(rows: list[dict]) -> str:
    lines = ["| mode | concurrency | metric | baseline | now | change | limit |", "|---|---|---|---|---|---|---|"]
    lines += [f"| {r['mode']} | {r['concurrency']} | {r['metric']} | {_fmt(r['baseline'], 2)} | "
              f"{_fmt(r['now'], 2)} | {r['change']} | {r['limit']} |" for r in rows]
    return "\n".join(lines)


def write_report(doc: dict, out: Path) -> list[Path]:
    """summary.json, summary.md and, where matplotlib is installed (requirements-dev.txt), the plots into `out`."""
    (out / "summary.json").write_text(json.dumps(doc, indent=2) + "\n")
    (out / "summary.md").write_text(markdown(doc))
    if importlib.util.find_spec("matplotlib") is None:
        return [out / "summary.json", out / "summary.md"]
    return [out / "summary.json", out / "summary.md", *plots(doc, out)]
