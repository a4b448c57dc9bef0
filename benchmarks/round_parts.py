"""Where a batch-1 round's time goes, per part, beside AR: the default job's cells (built-in pair, arithmetic, T=0.7,
top-p 0.95, 160 new tokens, one thread, thread CPU time), AR and the methods taking turns prompt by prompt.

    python benchmarks/round_parts.py [--prompts 24] [--cells strict:3 typical:3 strict:5 typical:5 pad:3]

Per cell: per-token time and x b1 (ratio of medians against AR, as the bench's `x b1`), tau, the block-aware model
S_blk at this run's speed constants and x b1 / S_blk (issue 27's figure); per round: the models' forwards (FastLlama
.forward) and the rest, split into the round's parts by timing the engine's own calls (the uniforms
`SequenceSeeds.at`, `drafter.propose` less its forwards, the verifier's feed less its forward, `VerifyStep.__call__`,
the book's `record`, the rollbacks, a PAD cell's classifier call (the built-in classifier's pivot_fn; c_pivot in
S_blk, measured by the speed constants); the verifier's feed is the time from the proposal to verify less the
verifier's forward and the classifier); per call: the time in all and the prefills' forwards. The wrappers add about
a microsecond per timed call (a few per round), so the parts read a little high.
"""

from __future__ import annotations

import collections
import statistics
import time

import torch

from harness.options import parser

CELLS = {"strict": {}, "typical": {"epsilon": 0.09, "delta": 0.3}, "mentored": {"alpha": 0.3}, "cactus": {"delta": 0.1},
         "spec-cont-dec": {"beta": 0.5},
         "pad": {"threshold": 0.5}}


def main():
    ap = parser(__doc__)
    ap.add_argument("--prompts", type=int, default=24)
    ap.add_argument("--cells", nargs="*", default=["strict:3", "typical:3", "strict:5", "typical:5"],
                    help="METHOD:N (methods: " + ", ".join(CELLS) + ")")
    args = ap.parse_args()
    torch.set_num_threads(1)
    from relaxspec.acceptance import get_rule
    from relaxspec.acceptance.random import SequenceSeeds
    from relaxspec.acceptance.verify import VerifyStep
    from relaxspec.bench.cell import CellSpec, generate_samples, speed_constants
    from relaxspec.bench.config import BenchConfig
    from relaxspec.bench.methods import needs_classifier
    from relaxspec.bench.speedup import block_aware_speedup
    from relaxspec.drafters.base import LMDrafter
    from relaxspec.engine import derive_seed
    from relaxspec.engine.book import Book
    from relaxspec.models import DEFAULT_DRAFTER, DEFAULT_VERIFIER, fast_llama, load_model
    from relaxspec.models.stream import Stream
    from relaxspec.tasks import get_task

    clock = time.thread_time
    parts = collections.defaultdict(float)
    state = {"forward": 0.0, "round": 0.0, "in_round": False, "prefill": False, "mark": None}

    def timed(owner, name, part, less_forwards=False, when=None, after=None):
        original = getattr(owner, name)

        def wrapper(*a, **k):
            if not state["in_round"] or (when is not None and not when(*a, **k)):
                return original(*a, **k)
            if part == "verify" and state["mark"] is not None:  # since the proposal: the verifier's feed
                t0, f0 = state["mark"]
                parts["verifier feed"] += clock() - t0 - (state["round"] - f0)
                state["mark"] = None
            f, t = state["round"], clock()
            try:
                return original(*a, **k)
            finally:
                spent = clock() - t
                parts[part] += spent - (state["round"] - f if less_forwards else 0.0)
                if after is not None:
                    state["mark"] = (clock(), state["round"])
        setattr(owner, name, wrapper)

    forward = fast_llama.FastLlama.forward

    def counted_forward(self, *a, **k):
        t = clock()
        try:
            return forward(self, *a, **k)
        finally:
            spent = clock() - t
            state["forward"] += spent
            if state["in_round"] and not state["prefill"]:
                state["round"] += spent
    fast_llama.FastLlama.forward = counted_forward
    stream_prefill, drafter_prefill = Stream.prefill, LMDrafter.prefill

    def verifier_prefill(self, *a, **k):  # the rounds start after the prefills
        out = stream_prefill(self, *a, **k)
        state["in_round"] = True
        return out

    def lm_drafter_prefill(self, *a, **k):
        state["prefill"] = True
        try:
            return drafter_prefill(self, *a, **k)
        finally:
            state["prefill"] = False
    Stream.prefill, LMDrafter.prefill = verifier_prefill, lm_drafter_prefill
    timed(SequenceSeeds, "at", "uniforms")
    timed(LMDrafter, "propose", "drafter loop", less_forwards=True, after=True)
    timed(VerifyStep, "__call__", "verify")
    timed(Book, "record", "record")
    timed(Stream, "invalidate_tail", "rollback", when=lambda self, *a, **k: self.lm is verifier)
    timed(LMDrafter, "rollback", "rollback")

    config = BenchConfig(speed_prompts=args.prompts)
    task = get_task("arithmetic", limit=args.prompts)
    models = {DEFAULT_VERIFIER: load_model(DEFAULT_VERIFIER), DEFAULT_DRAFTER: load_model(DEFAULT_DRAFTER)}
    verifier, drafter = models[DEFAULT_VERIFIER], models[DEFAULT_DRAFTER]
    cells = [("ar", {}, 0)] + [(m, CELLS[m], int(n)) for m, n in (c.split(":") for c in args.cells)]
    specs = [CellSpec(DEFAULT_VERIFIER, DEFAULT_DRAFTER if n else None, "arithmetic", m, p, n, 0) for m, p, n in cells]
    pivot_fn = classifier = None
    if any(needs_classifier(s.method) for s in specs):
        from relaxspec.pivot import builtin_classifier_path, load_classifier
        classifier = load_classifier(builtin_classifier_path()).pivot_fn()

        def pivot_fn(*inputs):  # timed as the round's "classifier" part, out of the verifier's feed
            t = clock()
            try:
                return classifier(*inputs)
            finally:
                spent = clock() - t
                parts["classifier"] += spent
                if state["mark"] is not None:
                    state["mark"] = (state["mark"][0] + spent, state["mark"][1])
        pivot_fn.hidden_layer = classifier.hidden_layer
    constants = speed_constants(models, [s for s in specs if s.draft_length], pivot_fn=classifier)
    totals = [collections.defaultdict(float) for _ in cells]
    per_token = [[] for _ in cells]
    for repeat in range(2):  # the first pass warms up
        for i in range(args.prompts):
            for j in (range(len(cells)) if i % 2 == 0 else reversed(range(len(cells)))):
                parts.clear()
                state.update(forward=0.0, round=0.0, in_round=False, prefill=False, mark=None)
                t = clock()
                out = generate_samples(specs[j], [task.examples[i].prompt], [derive_seed(0, i, 0)], verifier,
                                       drafter if cells[j][2] else None, config, pivot_fn)
                spent = clock() - t
                if repeat == 0:
                    continue
                stats, tokens = out.stats, len(out.results[0].token_ids)
                per_token[j].append(spent / tokens)
                total = totals[j]
                for name, value in parts.items():
                    total[name] += value
                total["round forwards"] += state["round"]
                total["all forwards"] += state["forward"]
                total["rounds"] += stats.verifier_forwards
                total["accepted"] += stats.drafts_accepted
                total["calls"] += 1
                total["time"] += spent
    ar = statistics.median(per_token[0])
    for (method, params, n), spec, total, times in zip(cells, specs, totals, per_token):
        rounds = total["rounds"]
        line = f"{method} N={n}: {1e6 * statistics.median(times):.0f} us per token, x b1 {ar / statistics.median(times):.3f}"
        if n:
            tau = (rounds + total["accepted"]) / rounds
            c = constants[(spec.verifier, spec.drafter, n)]
            c_pivot = c.get("c_pivot_measured", 0.0) if needs_classifier(method) else 0.0
            model = block_aware_speedup(tau, n, c["c_rel_measured"], c["c_block_measured"],
                                        get_rule(method).extra_draft_passes, c_pivot=c_pivot)
            line += (f", tau {tau:.2f}, S_blk {model:.3f} (c_rel {c['c_rel_measured']:.3f}, c_block "
                     f"{c['c_block_measured']:.2f}" + (f", c_pivot {c_pivot:.3f}" if c_pivot else "") +
                     f"), x b1 / S_blk {ar / statistics.median(times) / model:.3f}")
        print(line)
        named = [k for k in ("uniforms", "drafter loop", "verifier feed", "classifier", "verify", "record", "rollback")
                 if k in total]
        print(f"    per round: forwards {1e6 * total['round forwards'] / rounds:.0f} us; " +
              "; ".join(f"{k} {1e6 * total[k] / rounds:.0f}" for k in named) +
              (f"; these parts {1e6 * sum(total[k] for k in named) / rounds:.0f}" if n else
               " (AR: feed and sample not split out)"))
        print(f"    per call: {1e3 * total['time'] / total['calls']:.2f} ms in all, of which prefill forwards "
              f"{1e3 * (total['all forwards'] - total['round forwards']) / total['calls']:.2f} ms")


if __name__ == "__main__":
    main()
