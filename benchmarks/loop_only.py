"""The engine's own work alone: `generate` on the built-in pair with every model forward replaced by a stub that returns
fixed logits (cost ~1 us; EOS never drawn, so every call runs to --max-new-tokens), AR and the methods taking turns
prompt by prompt (arithmetic prompts, T=0.7, top-p 0.95, one thread, thread CPU time).

    python benchmarks/loop_only.py [--prompts 16] [--max-new-tokens 96] [--cells ar:0 strict:3 typical:3 strict:5]

Per cell: the median over prompts of the time per round and per token (a call's setup, prefill stubs and result
assembly included). The stub's random logits make acceptance low, so rounds are about as many as tokens: the per-round
figure is the loop's cost of a round, whatever it accepts.
"""

from __future__ import annotations

import statistics
import time

import torch

from harness.options import add, parser


def main():
    ap = parser(__doc__)
    add(ap, prompts=16, max_new_tokens=96)
    ap.add_argument("--cells", nargs="*", default=["ar:0", "strict:3", "typical:3", "strict:5"], help="METHOD:N")
    args = ap.parse_args()
    torch.set_num_threads(1)
    from relaxspec.engine import derive_seed, generate
    from relaxspec.models import DEFAULT_DRAFTER, DEFAULT_VERIFIER, fast_llama, load_model
    from relaxspec.tasks import get_task

    verifier, drafter = load_model(DEFAULT_VERIFIER), load_model(DEFAULT_DRAFTER)
    eos, g, fixed = verifier.eos_token_id, torch.Generator().manual_seed(0), {}

    def stub(self, input_ids, cache, attention_mask, position_ids, hidden_blocks=(), logits=True):
        B, T = input_ids.shape
        key = (B, T, id(self))
        if key not in fixed:
            z = 2.0 * torch.randn(B, T, self.lm_head.shape[0], generator=g)
            if eos is not None:
                z[..., eos] = -1e9
            fixed[key] = z
        cache.length += T
        return (fixed[key] if logits else None), None

    fast_llama.FastLlama.forward = stub
    task = get_task("arithmetic", limit=args.prompts)
    cells = [(m, int(n)) for m, n in (c.split(":") for c in args.cells)]
    times = {c: [] for c in cells}
    for repeat in range(2):  # the first pass warms up
        for i in range(args.prompts):
            for cell in (cells if i % 2 == 0 else cells[::-1]):
                method, n = cell
                t = time.thread_time()
                out = generate(verifier, drafter if n else None, task.examples[i].prompt, method=method,
                               draft_length=max(n, 1), seed=derive_seed(0, i), temperature=0.7, top_p=0.95,
                               max_new_tokens=args.max_new_tokens)
                spent = time.thread_time() - t
                if repeat:
                    times[cell].append((spent / out.stats.verifier_forwards, spent / len(out.results[0].token_ids)))
    for (method, n), rows in times.items():
        print(f"{method} N={n}: {1e6 * statistics.median(r for r, _ in rows):.0f} us per round, "
              f"{1e6 * statistics.median(t for _, t in rows):.0f} us per token")


if __name__ == "__main__":
    main()
