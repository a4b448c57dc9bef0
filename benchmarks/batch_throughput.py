"""Where a batched cell's time goes (what a protocol's sample costs): a batch of answers generated as a bench cell
generates them, then a decode step's cost by rows, then the model's linears alone by rows.

    python benchmarks/batch_throughput.py [--model qwen2.5-coder-1.5b] [--dtype int4] [--task gsm8k] [--batch 24]
        [--max-new-tokens 512] [--temperature 0.7] [--rows 1 6 12 24 48] [--context 300] [--threads 2]

1. AR on the task's first --batch problems in one generate call (a cell's batch; T > 0: top-p 0.95, seeds 0..B-1):
   the wall time, seconds an answer, the answers' lengths, and the batch's use: the answers' tokens over batch x the
   longest answer (a batch runs as long as its longest answer; its finished rows leave it, so the rest costs less,
   not nothing).
2. One decode step of R rows after --context tokens (random ids), R in --rows: ms a step and ms a row, the median of
   --repeats steps.
3. Every layer's qkv, o, gate_up and down alone on R rows of random inputs: ms over the layers and the multiply-adds
   a second (GMAC/s), the fastest of --repeats; how far more rows amortize the weights' reading, and where the
   kernel's own rate stops them.
"""

from __future__ import annotations

import statistics
import time

import torch

from harness.breakdown import LINEARS
from harness.options import add, parser, positive
from relaxspec.engine import generate
from relaxspec.models import load_model
from relaxspec.tasks import get_task

def batch_run(lm, prompts: list[str], max_new_tokens: int, temperature: float) -> dict:
    """One generate call of AR over `prompts` (its prefill included): wall seconds and the answers' lengths."""
    start = time.perf_counter()
    out = generate(lm, None, prompts, method="ar", max_new_tokens=max_new_tokens, temperature=temperature,
                   top_p=0.95 if temperature > 0 else None, seed=list(range(len(prompts))))
    lengths = [len(r.token_ids) for r in out.results]
    return {"wall": time.perf_counter() - start, "lengths": lengths}


def step_ms(lm, rows: int, context: int, repeats: int, gen: torch.Generator) -> float:
    """Median ms of one decode step of `rows` rows after `context` tokens each (the cache grows by a token a step)."""
    device = lm.device
    cache = lm.new_cache()
    ids = torch.randint(0, lm.vocab_size, (rows, context + repeats + 1), generator=gen).to(device)
    positions = torch.arange(context + repeats + 1, device=device).expand(rows, -1)
    lm.forward(ids[:, :context], cache, None, positions[:, :context], logits=False)
    times = []
    for i in range(context, context + repeats + 1):
        start = time.perf_counter()
        lm.forward(ids[:, i:i + 1], cache, None, positions[:, i:i + 1])
        times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times[1:])  # (the first step: warm-up)


def linears_rate(layers, rows: int, repeats: int, gen: torch.Generator) -> tuple[float, float]:
    """(ms over every layer's four linears on `rows` rows, GMAC/s), the fastest of `repeats` passes."""
    total_s = total_mac = 0.0
    for _, index in LINEARS:
        out_features, in_features = layers[0][index].shape
        x = torch.randn(rows, in_features, generator=gen)
        best = float("inf")
        for _ in range(repeats + 1):  # (the first pass: warm-up)
            start = time.perf_counter()
            for layer in layers:
                layer[index](x)
            best = min(best, time.perf_counter() - start)
        total_s += best
        total_mac += rows * out_features * in_features * len(layers)
    return 1000 * total_s, total_mac / total_s / 1e9


def main(argv=None) -> None:
    ap = parser(__doc__)
    add(ap, model="qwen2.5-coder-1.5b", dtype="int4", task="gsm8k", batch=24, max_new_tokens=512, temperature=0.7,
        context=300, repeats=5, threads=2)
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 6, 12, 24, 48])
    args = ap.parse_args(argv)
    positive(ap, args, "batch", "max_new_tokens", "context", "repeats", "threads")
    if min(args.rows) < 1:
        ap.error("--rows must be positive integers")
    torch.set_num_threads(args.threads)
    lm = load_model(args.model, dtype=args.dtype)
    if lm.fast is None:
        ap.error(f"{args.model}: no FastLlama path (transformers' own forward): its linears cannot be timed apart")
    prompts = [e.prompt for e in get_task(args.task, limit=args.batch).examples]
    gen = torch.Generator().manual_seed(0)
    with torch.inference_mode():
        run = batch_run(lm, prompts, args.max_new_tokens, args.temperature)
        steps = {r: step_ms(lm, r, args.context, args.repeats, gen) for r in args.rows}
        rates = {r: linears_rate(lm.fast.layers, r, args.repeats, gen) for r in args.rows}
    lengths = run["lengths"]
    print(f"model {args.model} ({args.dtype}), {args.threads} thread(s), task {args.task}, T = {args.temperature:g}")
    print(f"batch of {len(prompts)}, up to {args.max_new_tokens} tokens: {run['wall']:.1f} s, "
          f"{run['wall'] / len(prompts):.2f} s an answer; lengths min {min(lengths)} / median "
          f"{statistics.median(lengths):g} / max {max(lengths)}; the batch's use "
          f"{sum(lengths) / (len(lengths) * max(lengths)):.2f} (tokens over batch x longest)")
    print()
    print(f"| rows | decode step after {args.context} tokens, ms | ms a row | linears alone, ms | GMAC/s |")
    print("|---|---|---|---|---|")
    for r in args.rows:
        print(f"| {r} | {steps[r]:.1f} | {steps[r] / r:.2f} | {rates[r][0]:.1f} | {rates[r][1]:.0f} |")


if __name__ == "__main__":
    main()
