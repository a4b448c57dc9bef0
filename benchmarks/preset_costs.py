"""What a sample of `bench --preset qwen-coder` costs (relaxspec.bench.presets.Costs): per answer token, AR and
strict with the LM drafter at N = 3, greedy and at T = 0.7 / top-p 0.95, one prompt at a time (batch 1, prefill
included; the median over --b1-prompts) and all --batch prompts in one call (seconds over the tokens of all).

    python benchmarks/preset_costs.py [--verifier qwen2.5-coder-1.5b] [--drafter qwen2.5-coder-0.5b] [--dtype int4]
        [--batch 8] [--b1-prompts 4] [--max-new-tokens 128] [--threads 2]

Prompts: the humaneval-instruct task's first --batch problems. "gain": batch 1's time a token over the batch's; tau
of the batch call (tokens per round). Run it alone on the machine: these are wall times.
"""

from __future__ import annotations

import statistics
import time

import torch

from harness.options import add, parser, positive
from harness.output import header
from relaxspec.engine import generate
from relaxspec.models import load_model
from relaxspec.tasks import get_task


def main(argv=None) -> None:
    ap = parser(__doc__)
    add(ap, verifier="qwen2.5-coder-1.5b", drafter="qwen2.5-coder-0.5b", dtype="int4", batch=8, b1_prompts=4,
        max_new_tokens=128, threads=2)
    args = ap.parse_args(argv)
    positive(ap, args, "batch", "b1_prompts", "max_new_tokens", "threads")
    torch.set_num_threads(args.threads)
    prompts = get_task("humaneval-instruct", limit=args.batch).prompts
    verifier = load_model(args.verifier, dtype=args.dtype)
    drafter = load_model(args.drafter, dtype=args.dtype)
    sampled = dict(temperature=0.7, top_p=0.95)
    configs = {"AR, T=0": dict(method="ar", temperature=0.0), "AR, T=0.7": dict(method="ar", **sampled),
               "strict N=3, T=0": dict(method="strict", drafter=drafter, draft_length=3, temperature=0.0),
               "strict N=3, T=0.7": dict(method="strict", drafter=drafter, draft_length=3, **sampled)}

    def run(batch, kw):
        kw = dict(kw)
        t0 = time.perf_counter()
        out = generate(verifier, kw.pop("drafter", None), batch, max_new_tokens=args.max_new_tokens, seed=0, **kw)
        return time.perf_counter() - t0, out

    run(prompts[:1], configs["AR, T=0"])  # warm-up (kernels built, caches allocated)
    print(f"{args.verifier} ({args.dtype}), drafter {args.drafter}, {args.threads} threads, "
          f"{args.max_new_tokens} new tokens; ms per answer token")
    print(*header("config", "batch 1", f"batch {args.batch}", "gain", "tau"), sep="\n")
    for name, kw in configs.items():
        alone = []
        for p in prompts[:args.b1_prompts]:
            seconds, out = run([p], kw)
            alone.append(seconds / max(1, len(out.results[0].token_ids)))
        seconds, out = run(prompts, kw)
        per_token = seconds / max(1, sum(len(r.token_ids) for r in out.results))
        tau = out.stats.emitted_tokens / max(1, out.stats.sequence_rounds)
        b1 = statistics.median(alone)
        print(f"| {name} | {1000 * b1:.1f} | {1000 * per_token:.1f} | {b1 / per_token:.2f} | {tau:.2f} |")


if __name__ == "__main__":
    main()
