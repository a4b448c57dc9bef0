"""The CPU sampler: microseconds per call of processing and of inverse-CDF sampling, C kernels vs the torch path.

    python benchmarks/sampler_speed.py [--vocab 714 49152] [--rows 1 4] [--calls 200] [--rounds 5]
    python benchmarks/sampler_speed.py --engine [--prompts 16] [--draft-lengths 3 5]

For each vocabulary size, row count and logit spread (peaked to flat: the top-p set holds one token or most of
them), `process_logits_unchecked` at T=0.7 top-p 0.95 and `sample_with_uniform` on its output, timed with the
kernels (acceptance/fused.py) and without (`fused.disabled()`, the torch path), the two taking turns `--rounds`
times; medians. One thread, as the engine's batch-1 benchmarks.

With --engine: the built-in pair at batch 1, T=0.7 top-p 0.95 (greedy samples nothing), strict at each N and AR,
each prompt generated with the kernels and with the torch path in turns (the order alternating by prompt):
medians over prompts of ms per emitted token and of the torch / kernel ratio, and how many prompts gave the
same tokens both ways (the probabilities may differ in the last bits, the indices drawn from them rarely).
"""

from __future__ import annotations

import statistics
import time

import torch

from harness.options import add, parser
from harness.timing import builtin_pair
from relaxspec.acceptance import fused
from relaxspec.acceptance.processing import process_logits_unchecked, sample_with_uniform


def per_call_us(fn, calls: int) -> float:
    fn()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls * 1e6


def engine_rows(prompt_count: int, draft_lengths: list[int], max_new_tokens: int):
    from relaxspec.engine import generate

    verifier, drafter, prompts = builtin_pair(prompt_count)

    def run(prompt, method, n, seed):
        start = time.perf_counter()
        out = generate(verifier, drafter if method != "ar" else None, [prompt], method=method, draft_length=n,
                       max_new_tokens=max_new_tokens, temperature=0.7, top_p=0.95, seed=seed)
        return (time.perf_counter() - start) * 1e3 / max(1, out.stats.generated_tokens), out.results[0].token_ids

    print(f"{'method':>8} {'N':>3} | {'ms/token: C':>11} {'torch':>7} {'torch/C':>8} | same tokens")
    for method, n in [("strict", n) for n in draft_lengths] + [("ar", 0)]:
        kernel, reference, ratio, same = [], [], [], 0
        for i, prompt in enumerate(prompts):
            order = ("kernel", "torch") if i % 2 == 0 else ("torch", "kernel")
            got = {}
            for path in order:
                if path == "torch":
                    with fused.disabled():
                        got[path] = run(prompt, method, n, seed=i)
                else:
                    got[path] = run(prompt, method, n, seed=i)
            kernel.append(got["kernel"][0])
            reference.append(got["torch"][0])
            ratio.append(got["torch"][0] / got["kernel"][0])
            same += got["kernel"][1] == got["torch"][1]
        print(f"{method:>8} {n:3d} | {statistics.median(kernel):11.3f} {statistics.median(reference):7.3f} "
              f"{statistics.median(ratio):7.3f}x | {same}/{len(prompts)}", flush=True)


def main():
    ap = parser(__doc__)
    ap.add_argument("--vocab", type=int, nargs="*", default=[714, 49152])
    ap.add_argument("--rows", type=int, nargs="*", default=[1, 4])
    ap.add_argument("--spreads", type=float, nargs="*", default=[0.3, 3.0, 10.0], help="std of the logits")
    add(ap, calls=(200, "calls per timing (a tenth for V > 4096)"),
        rounds=(5, "kernel / torch timings taking turns; medians"),
        engine=(False, "whole generate calls instead (see above)"), prompts=16)
    ap.add_argument("--draft-lengths", type=int, nargs="*", default=[3, 5])
    add(ap, max_new_tokens=128)
    args = ap.parse_args()
    torch.set_num_threads(1)
    if fused.library() is None:
        raise SystemExit("the C kernels are unavailable here (RELAXSPEC_NATIVE=0 or no compiler): nothing to compare")
    if args.engine:
        engine_rows(args.prompts, args.draft_lengths, args.max_new_tokens)
        return
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
