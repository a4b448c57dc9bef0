"""The verify step's time at batch 1: the loop in C (acceptance/fused.py: verify_default, or first_rejection and
finish around the rule's torch math; a rule with its math in C, Rule.native_test, has it in the one call) against
the loop's and the rules' torch ops (`fused.loop_disabled()`; the sampler's other kernels serve both), taking turns.

    python benchmarks/verify_step.py [--rules strict typical] [--drafts 3 5] [--repeats 2000]
    python benchmarks/verify_step.py --engine-round [--prompts 12] [--max-new-tokens 64]

Default (the step alone): `VerifyStep` on random blocks of the built-in pair's shape (B=1, V=714, T=0.7, top-p 0.95,
drafts sampled from a noisy copy of the verifier, its processed distributions passed), a fresh round of counter draws per call as the engine makes
them (made before the timing); the two paths alternate call by call; median microseconds per call.
--engine-round: `generate` on the built-in pair (verifier, drafter-weak), arithmetic prompts one at a time, the
same settings; the two paths alternate prompt by prompt (same seed, so the same rounds: checked); per prompt, the
thread CPU time inside `VerifyStep.__call__` per round and the whole `generate` per round; medians over prompts.
One torch thread; times are thread CPU time (`time.thread_time`), which other processes' load inflates less.
"""

from __future__ import annotations

import contextlib
import statistics
import time

import numpy as np
import torch

from harness.options import add, parser
from harness.timing import builtin_pair, clocked
from relaxspec.acceptance import RULES, fused, process_logits
from relaxspec.acceptance.random import SequenceSeeds
from relaxspec.acceptance.verify import VerifyStep

SAMPLING = dict(temperature=0.7, top_p=0.95)
PATHS = ("C", "torch")


def path(name: str):
    # (A tree without the loop's kernels, run with PYTHONPATH=OLD/src for a before figure, times its one path twice.)
    off = getattr(fused, "loop_disabled", contextlib.nullcontext)
    return contextlib.nullcontext() if name == "C" else off()


def step_alone(rules, drafts, repeats: int, V: int = 714) -> None:
    g = torch.Generator().manual_seed(0)
    seeds = SequenceSeeds([7], "cpu")
    print(f"the step alone: B=1 V={V} T=0.7 top-p 0.95, median us per call over {repeats} calls each "
          f"(C and torch taking turns)")
    print(f"{'rule':<10}{'N':>3}{'C':>9}{'torch':>9}{'saved':>9}{'ratio':>8}")
    for name in rules:
        for N in drafts:
            blocks = []
            for _ in range(16):
                target = 3.0 * torch.randn(1, N + 1, V, generator=g)
                draft = target + 1.5 * torch.randn(1, N + 1, V, generator=g)
                q = process_logits(draft[:, :N], **SAMPLING)  # given to the step, as the engine's drafter does
                x = torch.multinomial(q[0], 1, generator=g).reshape(1, N)
                inputs = {"pivot_prob": torch.rand(1, N, generator=g)} if "pivot_prob" in RULES[name].inputs else {}
                blocks.append((target, draft, x, dict(draft_probs=q, **inputs)))
            step = VerifyStep(name, **SAMPLING)
            times = {p: [] for p in PATHS}
            for k in range(repeats + 50):
                target, draft, x, inputs = blocks[k % len(blocks)]
                for p in PATHS if k % 2 else PATHS[::-1]:
                    draws = seeds.at(None, N, host_start=np.array([k], dtype=np.int64))
                    with path(p):
                        t = time.thread_time()
                        step(target, draft, x, random=draws, **inputs)
                        if k >= 50:
                            times[p].append(time.thread_time() - t)
            c, ref = (1e6 * statistics.median(times[p]) for p in PATHS)
            print(f"{name:<10}{N:>3}{c:>9.1f}{ref:>9.1f}{ref - c:>9.1f}{c / ref:>8.2f}")


def engine_round(rules, drafts, prompts: int, max_new_tokens: int) -> None:
    from relaxspec.engine import generate

    inside = [0.0]
    VerifyStep.__call__ = clocked(VerifyStep.__call__, inside)
    verifier, drafter, texts = builtin_pair(prompts)
    print(f"inside generate: built-in pair, batch 1, {prompts} arithmetic prompts, max_new_tokens {max_new_tokens}, "
          f"T=0.7 top-p 0.95; medians over prompts of us per round (C and torch taking turns prompt by prompt)")
    print(f"{'rule':<10}{'N':>3}{'verify C':>10}{'torch':>9}{'saved':>9}{'round C':>10}{'torch':>9}{'ratio':>8}")
    for name in rules:
        for N in drafts:
            per = {p: ([], []) for p in PATHS}
            for i, text in enumerate(texts):
                outs = []
                for p in PATHS if i % 2 else PATHS[::-1]:
                    inside[0] = 0.0
                    with path(p):
                        t = time.thread_time()
                        out = generate(verifier, drafter, [text], method=name, draft_length=N,
                                       max_new_tokens=max_new_tokens, seed=i, **SAMPLING)
                        total = time.thread_time() - t
                    rounds = out.stats.verifier_forwards
                    per[p][0].append(inside[0] / rounds)
                    per[p][1].append(total / rounds)
                    outs.append(out.results[0].token_ids)
                assert outs[0] == outs[1], f"{name} N={N} prompt {i}: the two paths' tokens differ"
            (vc, rc), (vt, rt) = ((1e6 * statistics.median(v), 1e6 * statistics.median(r)) for v, r in per.values())
            print(f"{name:<10}{N:>3}{vc:>10.1f}{vt:>9.1f}{vt - vc:>9.1f}{rc:>10.1f}{rt:>9.1f}{rc / rt:>8.3f}")


def main() -> None:
    ap = parser(__doc__)
    ap.add_argument("--rules", nargs="+", default=["strict", "typical"], choices=list(RULES))
    ap.add_argument("--drafts", nargs="+", type=int, default=[3, 5])
    add(ap, repeats=(2000, "calls per path (the step alone)"),
        engine_round=(False, "verify's time per round inside generate"), prompts=12, max_new_tokens=64)
    args = ap.parse_args()
    torch.set_num_threads(1)
    if fused.library() is None:
        raise SystemExit("the C kernels did not load (no compiler, or RELAXSPEC_NATIVE=0): nothing to compare")
    if args.engine_round:
        engine_round(args.rules, args.drafts, args.prompts, args.max_new_tokens)
    else:
        step_alone(args.rules, args.drafts, args.repeats)


if __name__ == "__main__":
    main()
