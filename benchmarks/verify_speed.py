"""Time each acceptance rule's `verify` on CPU.

B=64 sequences, N=5 drafts, V=32000, random logits, drafts sampled from the
processed drafter distribution, temperature 1. Prints ms per call (median of
repeats after warm-up) and the ratio to strict.

    python benchmarks/verify_speed.py [--repeats 15] [--threads 1]
"""

from __future__ import annotations

import statistics
import time

import torch

from harness.options import add, parser
from relaxspec.acceptance import RULES, process_logits, verify


def make_block(B: int, N: int, V: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    target = 3.0 * torch.randn(B, N + 1, V, generator=g)
    # The drafter is a noisy copy of the verifier, as a real pair would be; its row at the bonus
    # position is there for the rules that declare the extra drafter pass (the others ignore it).
    draft = target + 1.5 * torch.randn(B, N + 1, V, generator=g)
    q = process_logits(draft[:, :N])
    drafts = torch.multinomial(q.reshape(B * N, V), 1, generator=g).reshape(B, N)
    pivot_prob = torch.rand(B, N, generator=g)
    return target, draft, drafts, pivot_prob


def time_rules(names, target, draft, drafts, pivot_prob, repeats, warmup):
    """Median ms per call for each rule. Rules are interleaved round by round, so
    load from other processes on a shared machine hits every rule alike."""
    g = torch.Generator().manual_seed(1)

    def call(name):
        kwargs = {"pivot_prob": pivot_prob} if "pivot_prob" in RULES[name].inputs else {}
        verify(name, target, draft, drafts, generator=g, **kwargs)

    for _ in range(warmup):
        for name in names:
            call(name)
    times = {name: [] for name in names}
    for _ in range(repeats):
        for name in names:
            t0 = time.perf_counter()
            call(name)
            times[name].append(time.perf_counter() - t0)
    return {name: 1e3 * statistics.median(ts) for name, ts in times.items()}


def main() -> None:
    ap = parser(__doc__)
    add(ap, batch=64, drafts=5, vocab=32000, repeats=15, warmup=2)
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    block = make_block(args.batch, args.drafts, args.vocab)
    print(f"B={args.batch} N={args.drafts} V={args.vocab} temperature=1 "
          f"threads={torch.get_num_threads()} (median of {args.repeats})")
    results = time_rules(list(RULES), *block, args.repeats, args.warmup)
    base = results["strict"]
    print(f"{'rule':<15}{'ms/call':>10}{'x strict':>10}")
    for name, ms in results.items():
        print(f"{name:<15}{ms:>10.2f}{ms / base:>10.2f}")


if __name__ == "__main__":
    main()
