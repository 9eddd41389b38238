"""python -m speed [ID ...]: run the toolkit benchmarks (all, or the ones named), print their
figures and write them to speed/results/ID.json. Runs against the lab selected by
SPECFLEET_LAB_ID, booting the hosts each benchmark needs. BENCH_ROUNDS sets repetitions."""

import importlib
import sys
import time

BENCHMARKS = ["P1", "P1b", "P2", "P3", "P3b", "P4", "P5", "P7"]
MEASURED_BY = {"P3b": "P3"}  # figures measured side by side in another benchmark's run
SEPARATE = ["P6"]  # moves several GB: run on its own, `python -m speed P6`


def main(argv: list[str]) -> int:
    wanted = argv or BENCHMARKS
    unknown = [b for b in wanted if b not in BENCHMARKS + SEPARATE]
    if unknown:
        print(f"unknown benchmark(s) {unknown}; choose from {BENCHMARKS + SEPARATE}", file=sys.stderr)
        return 2
    failed, ran = [], set()
    for bench_id in wanted:
        runner = MEASURED_BY.get(bench_id, bench_id)
        if runner in ran:
            continue
        ran.add(runner)
        started = time.monotonic()
        try:
            importlib.import_module(f"speed.{runner.lower()}").main()
        except (Exception, SystemExit) as error:  # one failing benchmark (or lab start) does not stop the others
            print(f"{bench_id} failed: {error}", file=sys.stderr)
            failed.append(bench_id)
        print(f"[{bench_id}: {time.monotonic() - started:.0f}s]", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
