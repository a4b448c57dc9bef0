"""The CPU sampler: microseconds per call of processing and of inverse-CDF sampling, C kernels vs the torch path.

    python benchmarks/sampler_speed.py [--vocab 714 49152] [--rows 1 4] [--calls 200] [--rounds 5]

For each vocabulary size, row count and logit spread (peaked to flat: the top-p set holds one token or most of
them), `process_logits_unchecked` at T=0.7 top-p 0.95 and `sample_with_uniform` on its output, timed with the
kernels (acceptance/fused.py) and without (`fused.disabled()`, the torch path), the two taking turns `--rounds`
times; medians. One thread, as the engine's batch-1 benchmarks.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from relaxspec.acceptance import fused
from relaxspec.acceptance.processing import process_logits_unchecked, sample_with_uniform


def per_call_us(fn, calls: int) -> float:
    fn()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls * 1e6


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--vocab", type=int, nargs="*", default=[714, 49152])
    ap.add_argument("--rows", type=int, nargs="*", default=[1, 4])
    ap.add_argument("--spreads", type=float, nargs="*", default=[0.3, 3.0, 10.0], help="std of the logits")
    ap.add_argument("--calls", type=int, default=200, help="calls per timing (a tenth for V > 4096)")
    ap.add_argument("--rounds", type=int, default=5, help="kernel / torch timings taking turns; medians")
    args = ap.parse_args()
    torch.set_num_threads(1)
    if fused.library() is None:
        raise SystemExit("the C kernels are unavailable here (RELAXSPEC_NATIVE=0 or no compiler): nothing to compare")
    g = torch.Generator().manual_seed(0)
    print(f"{'V':>6} {'rows':>4} {'spread':>6} {'kept':>7} | {'process us: C':>13} {'torch':>7} {'x':>5} | "
          f"{'sample us: C':>12} {'torch':>7} {'x':>5}")
    for V in args.vocab:
        calls = args.calls if V <= 4096 else max(1, args.calls // 10)
        for rows in args.rows:
            for spread in args.spreads:
                z = torch.randn((rows, V), generator=g) * spread
                u = torch.rand(rows, generator=g, dtype=torch.float64)
                probs = process_logits_unchecked(z, 0.7, None, 0.95)
                kept = (probs > 0).sum(dim=-1).float().mean().item()
                times = {key: [] for key in ("pc", "pt", "sc", "st")}
                for _ in range(args.rounds):
                    times["pc"].append(per_call_us(lambda: process_logits_unchecked(z, 0.7, None, 0.95), calls))
                    times["sc"].append(per_call_us(lambda: sample_with_uniform(probs, u), calls))
                    with fused.disabled():
                        times["pt"].append(per_call_us(lambda: process_logits_unchecked(z, 0.7, None, 0.95), calls))
                        times["st"].append(per_call_us(lambda: sample_with_uniform(probs, u), calls))
                m = {key: statistics.median(v) for key, v in times.items()}
                print(f"{V:6d} {rows:4d} {spread:6.1f} {kept:7.1f} | {m['pc']:13.1f} {m['pt']:7.1f} "
                      f"{m['pt'] / m['pc']:5.1f} | {m['sc']:12.1f} {m['st']:7.1f} {m['st'] / m['sc']:5.1f}")


if __name__ == "__main__":
    main()
