"""How much the default job's batch-1 figure moves by itself: strict's `x b1` and its block-aware model S_blk measured
again and again in one process, the same code, prompts and seeds (built-in pair, arithmetic, T=0.7, top-p 0.95, 160
new tokens, one thread, thread CPU time, AR and strict taking turns prompt by prompt as the bench does).

    python benchmarks/b1_repeat.py [--prompts 16] [--repeats 8] [--draft-length 3]

Per repeat: the speed constants (`speed_constants`, as the bench measures them) before the prompts, then `x b1` three
ways (ratio of the median per-token times: the bench's; median of the per-prompt ratios; ratio of the means), tau of
these runs, S_blk at that tau and x b1 / S_blk. The spread across repeats is the figure's noise at that many prompts.
"""

from __future__ import annotations

import statistics
import time

import torch

from harness.options import add, parser


def main():
    ap = parser(__doc__)
    add(ap, prompts=16, repeats=8, draft_length=3)
    args = ap.parse_args()
    torch.set_num_threads(1)
    from relaxspec.bench.cell import CellSpec, generate_samples, speed_constants
    from relaxspec.bench.config import BenchConfig
    from relaxspec.bench.speedup import block_aware_speedup
    from relaxspec.engine import derive_seed
    from relaxspec.models import DEFAULT_DRAFTER, DEFAULT_VERIFIER, load_model
    from relaxspec.tasks import get_task

    P, N = args.prompts, args.draft_length
    config = BenchConfig(speed_prompts=P)
    task = get_task("arithmetic", limit=P)
    v, d = load_model(DEFAULT_VERIFIER), load_model(DEFAULT_DRAFTER)
    ar = CellSpec(DEFAULT_VERIFIER, None, "arithmetic", "ar", {}, 0, 0)
    strict = CellSpec(DEFAULT_VERIFIER, DEFAULT_DRAFTER, "arithmetic", "strict", {}, N, 0)

    def run(cell, i):
        return generate_samples(cell, [task.examples[i].prompt], [derive_seed(0, i, 0)], v,
                                d if cell is strict else None, config, None)

    for i in range(min(4, P)):  # warm-up
        run(strict, i), run(ar, i)
    print(f"strict N={N}, {P} prompts per repeat")
    print(f"{'x b1':>7}{'med ratio':>10}{'mean':>7}{'tau':>6}{'c_rel':>7}{'c_block':>8}{'S_blk':>7}{'x b1/S_blk':>11}")
    for _ in range(args.repeats):
        c = speed_constants({DEFAULT_VERIFIER: v, DEFAULT_DRAFTER: d}, [strict])[(DEFAULT_VERIFIER, DEFAULT_DRAFTER, N)]
        per_token = {"ar": [], "strict": []}
        rounds = accepted = 0
        for i in range(P):
            for cell in ((ar, strict) if i % 2 == 0 else (strict, ar)):
                t = time.thread_time()
                out = run(cell, i)
                per_token[cell.method].append((time.thread_time() - t) / max(1, len(out.results[0].token_ids)))
                if cell is strict:
                    rounds, accepted = rounds + out.stats.verifier_forwards, accepted + out.stats.drafts_accepted
        a, s = per_token["ar"], per_token["strict"]
        x = statistics.median(a) / statistics.median(s)
        tau = (rounds + accepted) / rounds
        model = block_aware_speedup(tau, N, c["c_rel_measured"], c["c_block_measured"], 0)
        print(f"{x:>7.3f}{statistics.median(p / q for p, q in zip(a, s)):>10.3f}{sum(a) / sum(s):>7.3f}{tau:>6.2f}"
              f"{c['c_rel_measured']:>7.3f}{c['c_block_measured']:>8.3f}{model:>7.3f}{x / model:>11.3f}")


if __name__ == "__main__":
    main()
