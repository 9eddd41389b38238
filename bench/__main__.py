"""python -m bench [ID ...]: run the toolkit benchmarks (all, or the ones named), print their
figures and write them to bench/results/ID.json. Runs against the lab selected by
SPECFLEET_LAB_ID, booting the hosts each benchmark needs. BENCH_ROUNDS sets repetitions."""

import importlib
import sys
import time

BENCHMARKS = ["P1", "P1b", "P2", "P3", "P4"]


def main(argv: list[str]) -> int:
    wanted = argv or BENCHMARKS
    unknown = [b for b in wanted if b not in BENCHMARKS]
    if unknown:
        print(f"unknown benchmark(s) {unknown}; choose from {BENCHMARKS}", file=sys.stderr)
        return 2
    failed = []
    for bench_id in wanted:
        started = time.monotonic()
        try:
            importlib.import_module(f"bench.{bench_id.lower()}").main()
        except Exception as error:  # one failing benchmark does not stop the others
            print(f"{bench_id} failed: {error}", file=sys.stderr)
            failed.append(bench_id)
        print(f"[{bench_id}: {time.monotonic() - started:.0f}s]", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
