"""Profile of the batch-1 speculative round: where the time goes between the models' forwards.

    python benchmarks/engine_profile.py [--prompts 12] [--draft-lengths 3 5] [--top 0] [--ar]

Runs the built-in pair (strict, one prompt at a time, one thread; with --ar also AR, as N = 0) under cProfile
at T=0.7 top-p 0.95 and greedy, and prints per setting: ms per round (verify steps), ms per emitted token,
the share of the time inside the models' forward calls, and (with --top K) the K most expensive functions by own time.
cProfile inflates tiny Python calls, so the absolute figures are above an unprofiled run's; the share
outside the forwards is what the lean loop cuts. The profiler's clock is this thread's CPU time, so other
processes' load inflates the figures less (cache and memory contention still do).
"""

from __future__ import annotations

import cProfile
import pstats
import time

import torch

from harness.options import add, parser
from harness.timing import builtin_pair
from relaxspec.engine import generate


def forward_seconds(stats: pstats.Stats) -> float:
    """Cumulative seconds inside the models' forward calls (CausalLM.forward, FastLlama.forward, the MTP head)."""
    total = 0.0
    for (filename, _, name), (_, _, _, cumulative, _) in stats.stats.items():
        if name == "forward" and filename.endswith(("models/hf.py",)):
            total += cumulative
    return total


def main():
    ap = parser(__doc__)
    add(ap, verifier="verifier", drafter="drafter-weak", prompts=12, max_new_tokens=128)
    ap.add_argument("--draft-lengths", type=int, nargs="*", default=[3, 5])
    add(ap, top=(0, "print the K functions with the most own time"),
        ar=(False, "also profile AR (shown as N = 0; a round is one token)"))
    args = ap.parse_args()
    torch.set_num_threads(1)
    verifier, drafter, prompts = builtin_pair(args.prompts, args.verifier, args.drafter)
    print(f"{'temp':>5} {'N':>3} {'rounds':>7} {'tokens':>7} {'ms/round':>9} {'ms/token':>9} {'forwards':>9}")
    for temperature in (0.7, 0.0):
        for n in [*args.draft_lengths, *([0] if args.ar else [])]:  # N = 0: AR (a round is one token)
            profile = cProfile.Profile(time.thread_time)
            rounds = tokens = 0
            profile.enable()
            for i, prompt in enumerate(prompts):
                out = generate(verifier, drafter if n else None, [prompt], method="strict" if n else "ar",
                               draft_length=max(n, 1), max_new_tokens=args.max_new_tokens, temperature=temperature,
                               top_p=0.95 if temperature else None, seed=i)
                rounds += out.stats.verifier_forwards
                tokens += out.stats.generated_tokens
            profile.disable()
            stats = pstats.Stats(profile)
            total = stats.total_tt
            print(f"{temperature:5.1f} {n:3d} {rounds:7d} {tokens:7d} {1e3 * total / rounds:9.2f} "
                  f"{1e3 * total / tokens:9.2f} {forward_seconds(stats) / total:8.0%}", flush=True)
            if args.top:
                stats.sort_stats("tottime").print_stats(args.top)


if __name__ == "__main__":
    main()
