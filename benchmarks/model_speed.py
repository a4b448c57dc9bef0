"""Per-token decode latency of one model: relaxspec's FastLlama path vs transformers, float32 vs bfloat16,
by thread count (on a CPU; any --device works).

    python benchmarks/model_speed.py [--model smollm2] [--threads 1 2] [--dtypes float32 bfloat16]

"AR ms/token" is the median latency of one cached forward of 1 token after `--context` tokens (what an
autoregressive step costs); "block" is the same for `--block` tokens at once (a verifier's N+1 block).
The model is loaded once; the other dtype is a converted copy of the same weights.
"""

from __future__ import annotations

import copy
import statistics

import torch

from harness.options import add, parser
from relaxspec.models import load_model, measure_step_latency
from relaxspec.models.fast_llama import FastLlama
from relaxspec.models.hf import CausalLM


def variants(base: CausalLM, dtypes: list[str]):
    """(dtype, backend, CausalLM) for every dtype and both backends, sharing one loaded model."""
    for dtype in dtypes:
        model = base.model if dtype == "float32" else copy.deepcopy(base.model).to(getattr(torch, dtype))
        yield dtype, "transformers", CausalLM(base.name, model, base.tokenizer)
        if FastLlama.supports(model):
            yield dtype, "fast", CausalLM(base.name, model, base.tokenizer, FastLlama(model))


def main() -> None:
    ap = parser(__doc__)
    add(ap, model=("smollm2", "any load_model name (built-in, directory, GGUF)"), device="cpu")
    ap.add_argument("--threads", type=int, nargs="*", default=[1, 2])
    ap.add_argument("--dtypes", nargs="*", default=["float32", "bfloat16"])
    add(ap, context=128, block=6, repeats=(10, "forwards per measurement (median)"),
        turns=(5, "measurements per variant, taken in turns (median)"))
    args = ap.parse_args()
    base = load_model(args.model, device=args.device, dtype="float32", backend="transformers")
    print(f"{args.model}: {base.num_parameters() / 1e6:.1f}M parameters on {base.device}; context {args.context}; "
          f"medians of {args.turns} turns")
    print(f"{'dtype':<9} {'backend':<13} {'threads':>7} {'AR ms/token':>12} {f'block {args.block} ms':>12}")
    rows = list(variants(base, args.dtypes))
    for threads in args.threads:
        torch.set_num_threads(threads)
        # The variants take turns, so a change in the machine's load hits all of them alike.
        times = {(dtype, backend): ([], []) for dtype, backend, _ in rows}
        for _ in range(args.turns):
            for dtype, backend, lm in rows:
                one, block = times[dtype, backend]
                one.append(measure_step_latency(lm, args.context, 1, args.repeats))
                block.append(measure_step_latency(lm, args.context, args.block, args.repeats))
        for (dtype, backend), (one, block) in times.items():
            print(f"{dtype:<9} {backend:<13} {threads:>7} {statistics.median(one) * 1e3:>12.2f} "
                  f"{statistics.median(block) * 1e3:>12.2f}", flush=True)

if __name__ == "__main__":
    main()
