"""Ray's fixed costs for bench cells: start-up of a local instance, first job per worker (process start), and the
round trip per job on warm workers (submit, schedule, pickle a job and its result), with jobs that do nothing.

    PYTHONPATH=src python benchmarks/ray_overhead.py [--jobs 200] [--cpus 2]
"""

import argparse
import statistics
import time
from dataclasses import dataclass

from harness.options import add
from relaxspec.bench.executors import ExecutorOptions, make_executor


@dataclass
class Noop:
    label: str
    payload: int = 0  # bytes returned, like a cell's rows
    affinity: str = "pair"

    def run(self, cache):
        return b"x" * self.payload


def main() -> None:
    p = argparse.ArgumentParser()
    add(p, jobs=200, payload=(50_000, "bytes each job returns (a cell's rows: ~10-100 kB)"))
    args = p.parse_args()
    t0 = time.perf_counter()
    pool = make_executor(ExecutorOptions(kind="ray"))
    t_init = time.perf_counter() - t0
    try:
        t0 = time.perf_counter()
        workers = pool.capacity()
        warm = list(pool.run([Noop(f"warm{i}") for i in range(workers)]))
        t_first = time.perf_counter() - t0
        t0 = time.perf_counter()
        done = list(pool.run([Noop(f"j{i}", args.payload) for i in range(args.jobs)]))
        t_jobs = time.perf_counter() - t0
    finally:
        pool.close()
    print(f"ray start-up {t_init:.2f} s; first jobs (worker processes start) {t_first:.2f} s for {len(warm)} jobs")
    print(f"{args.jobs} no-op jobs returning {args.payload} B on {workers} warm workers: "
          f"{t_jobs:.2f} s, {1000 * t_jobs / args.jobs:.1f} ms per job (throughput); median round trip "
          f"{1000 * statistics.median(f.seconds for f in done):.1f} ms")


if __name__ == "__main__":
    main()
