"""The verify step's peak memory and time on one large block: each rule at T = 0 (where the rules' torch math runs:
sampling goes through their C) and, with --temperatures, at others.

    python benchmarks/verify_memory.py [--rules strict spec-casc-tok typical] [--batch 55] [--drafts 10]
        [--vocab 151936] [--temperatures 0] [--blocks 5] [--threads 2]

Each (rule, temperature) runs in a fresh subprocess: random float32 logits of the block's shape (the verifier's
[B, N+1, V], the drafter's [B, N, V] as a noisy copy, its drafts its argmax at T = 0 or sampled, its processed
distributions passed as the engine does), then --blocks calls of one `VerifyStep` on the same block. Printed: the
inputs' resident size, the peak above it (getrusage's maxrss), the resident size after the last block above the
inputs, the allocator's free lists given back first (glibc's malloc_trim): what the blocks leave behind, 0 when every
block's tensors are freed as it ends; and the median time a block.
The default shape is the real pair's preset at N = auto's longest blocks (55 problems, 10 drafts, Qwen2.5's vocabulary).
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time

from harness.options import add, positive
from harness.output import header


def child(rule: str, batch: int, drafts: int, vocab: int, temperature: float, blocks: int, threads: int) -> dict:
    import torch

    from relaxspec.acceptance import RULES, process_logits
    from relaxspec.acceptance.verify import VerifyStep

    torch.set_num_threads(threads)
    g = torch.Generator().manual_seed(0)
    target = 3.0 * torch.randn(batch, drafts + 1, vocab, generator=g)
    draft = target[:, :drafts] + torch.randn(batch, drafts, vocab, generator=g)
    probs = process_logits(draft, temperature=temperature)
    tokens = (probs.argmax(-1) if temperature == 0 else
              torch.multinomial(probs.reshape(-1, vocab), 1, generator=g).reshape(batch, drafts))
    inputs = {"pivot_prob": torch.rand(batch, drafts, generator=g)} if "pivot_prob" in RULES[rule].inputs else {}
    base = _resident()
    step = VerifyStep(rule, temperature=temperature)
    times = []
    for _ in range(blocks):
        start = time.perf_counter()
        step(target, draft, tokens, draft_probs=probs, generator=g, **inputs)
        times.append(time.perf_counter() - start)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    _trim()
    return {"inputs_gb": base / 1e9, "peak_gb": (peak - base) / 1e9, "left_gb": (_resident() - base) / 1e9,
            "ms": 1000 * statistics.median(times)}


def _trim() -> None:
    """The allocator's free memory back to the system (glibc's malloc_trim, where there is one): what stays resident
    after it is held by live objects, not by free lists."""
    import ctypes
    import ctypes.util
    try:
        ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def _resident() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rules", nargs="+", default=["strict", "spec-casc-tok", "typical", "topk-delta"])
    add(p, batch=55, drafts=10, vocab=151936)
    p.add_argument("--temperatures", type=float, nargs="+", default=[0.0])
    add(p, blocks=5, threads=2)
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps(child(**json.loads(args.child))))
        return 0
    from relaxspec.acceptance import RULES
    unknown = [r for r in args.rules if r not in RULES]
    if unknown:
        p.error(f"unknown rule(s) {', '.join(unknown)}; known: {', '.join(RULES)}")
    positive(p, args, "batch", "drafts", "vocab", "blocks", "threads")
    print(f"verify step on a block of {args.batch} x {args.drafts} drafts x {args.vocab} tokens, float32, "
          f"{args.blocks} blocks, {args.threads} threads; GB above the inputs")
    print(*header("rule", "T", "inputs GB", "peak above", "left after the last block", "ms a block"), sep="\n")
    for rule in args.rules:
        for temperature in args.temperatures:
            spec = dict(rule=rule, batch=args.batch, drafts=args.drafts, vocab=args.vocab, temperature=temperature,
                        blocks=args.blocks, threads=args.threads)
            done = subprocess.run([sys.executable, __file__, "--child", json.dumps(spec)], capture_output=True,
                                  text=True)
            if done.returncode != 0:
                print(f"| {rule} | {temperature:g} | failed: {done.stderr.strip().splitlines()[-1]} | | | |")
                continue
            r = json.loads(done.stdout.strip().splitlines()[-1])
            print(f"| {rule} | {temperature:g} | {r['inputs_gb']:.2f} | {r['peak_gb']:.2f} | {r['left_gb']:.2f} | "
                  f"{r['ms']:.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
