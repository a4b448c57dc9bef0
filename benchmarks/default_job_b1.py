"""The default job's batch-1 figures in two minutes: `x b1` (measured) next to the block-aware model S_blk for a
few cells of the built-in pair, with the bench's own code (bench.cell.time_batch1_cells, speed_constants) and
settings (arithmetic, T=0.7, top-p 0.95, 160 new tokens, one thread, thread CPU time).

    python benchmarks/default_job_b1.py [--prompts 16] [--draft-lengths 3 5] [--pad [--pivot-call module]]
        [--methods strict typical cactus:delta=0.1 ...]

tau comes from the same cells run on the next `--prompts` prompts in one batch (the default job takes it from its
samples); S_blk counts a rule's extra drafter passes (spec-cont-dec's), as the bench does. measured / model is the
figure issue 27 targets (>= 0.9; strict N=3 >= 1.0x). --methods: the cells, as
`relaxspec bench --methods` names them (default: strict and typical at their defaults).
--pad adds a PAD cell (threshold 0.5, the built-in classifier) at each N, its classifier call timed in the speed
constants' rounds (c_piv: one call on an N-draft block / verifier step; 0 for the other cells) and priced in S_blk;
S_blk-c_piv is the model without it. --pivot-call module runs the classifier through the module's forward each
round (`predict_proba`: module calls, standardisation, Dropout, device moves), the call path before pivot_fn's
inference closure; its features are the shared `candidate_features` either way. A tree from before c_pivot, run
with PYTHONPATH=OLD/src for a before figure, measures no c_piv (0: its S_blk left the classifier out).
"""

from __future__ import annotations

import inspect

import torch

from harness.options import add, parser
from relaxspec.acceptance import get_rule
from relaxspec.bench.cell import CellSpec, generate_samples, speed_constants, time_batch1_cells
from relaxspec.bench.config import BenchConfig
from relaxspec.bench.methods import needs_classifier, parse_method
from relaxspec.bench.speedup import block_aware_speedup
from relaxspec.engine import derive_seed
from relaxspec.models import DEFAULT_DRAFTER, DEFAULT_VERIFIER, load_model
from relaxspec.tasks import get_task

CELLS = [("strict", {}), ("typical", {"epsilon": 0.09, "delta": 0.3})]


def main():
    ap = parser(__doc__)
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--draft-lengths", type=int, nargs="*", default=[3, 5])
    ap.add_argument("--methods", nargs="*", default=None, help="NAME or NAME:PARAM=V[;...] (default: strict typical)")
    add(ap, pad=(False, "add a PAD cell (threshold 0.5) at each N"))
    ap.add_argument("--pivot-call", choices=["closure", "module"], default="closure",
                    help="the classifier's call: pivot_fn's inference closure, or the module's predict_proba")
    args = ap.parse_args()
    torch.set_num_threads(1)
    config = BenchConfig(speed_prompts=args.prompts)
    task = get_task("arithmetic", limit=2 * args.prompts)
    models = {DEFAULT_VERIFIER: load_model(DEFAULT_VERIFIER), DEFAULT_DRAFTER: load_model(DEFAULT_DRAFTER)}
    cells = CELLS if args.methods is None else [cell for item in args.methods for cell in parse_method(item)]
    cells += [("pad", {"threshold": 0.5})] * args.pad
    specs = [CellSpec(DEFAULT_VERIFIER, DEFAULT_DRAFTER, "arithmetic", method, params, n, 0)
             for n in args.draft_lengths for method, params in cells]
    pivot_fn = _pivot_fn(args.pivot_call) if args.pad else None
    measures_pivot = "pivot_fn" in inspect.signature(speed_constants).parameters  # not in a tree from before
    constants = speed_constants(models, specs, **({"pivot_fn": pivot_fn} if measures_pivot else {}))
    pair = lambda s: (models[DEFAULT_VERIFIER], models[DEFAULT_DRAFTER])  # noqa: E731
    timed = time_batch1_cells(specs, task, pair, config, pivot_fn)
    print(f"{'cell':<28} {'tau':>5} {'c_rel':>6} {'c_blk':>6} {'c_piv':>6} {'S_blk':>6} {'x b1':>6} {'meas/model':>10} "
          f"{'S_blk-c_piv':>11} {'us/call':>7}")
    for spec, b1 in zip(specs, timed):
        prompts = [task.examples[i].prompt for i in range(args.prompts, 2 * args.prompts)]
        out = generate_samples(spec, prompts, [derive_seed(0, i, 0) for i in range(len(prompts))],
                               *pair(spec), config, pivot_fn)
        s = out.stats
        tau = (s.sequence_rounds + s.drafts_accepted) / s.sequence_rounds
        c = constants[(spec.verifier, spec.drafter, spec.draft_length)]
        c_pivot = c.get("c_pivot_measured", 0.0) if needs_classifier(spec.method) else 0.0
        extra = get_rule(spec.method).extra_draft_passes  # (spec-cont-dec: its bonus-position pass, as the bench)
        model = block_aware_speedup(tau, spec.draft_length, c["c_rel_measured"], c["c_block_measured"], extra,
                                    **({"c_pivot": c_pivot} if c_pivot else {}))
        without = block_aware_speedup(tau, spec.draft_length, c["c_rel_measured"], c["c_block_measured"], extra)
        x = b1["measured_speedup_batch1"]
        label = f"{spec.method}{spec.params or ''} N={spec.draft_length}"
        print(f"{label[:28]:<28} {tau:5.2f} {c['c_rel_measured']:6.3f} {c['c_block_measured']:6.2f} {c_pivot:6.3f} "
              f"{model:6.2f} {x:6.2f} {x / model:10.2f} {without:11.2f} {1e6 * c_pivot * c['latency_verifier_s']:7.0f}",
              flush=True)


def _pivot_fn(call: str):
    """The built-in classifier's pivot_fn, or (module) a callable through its module forward (`predict_proba`)."""
    from relaxspec.pivot import builtin_classifier_path, load_classifier

    clf = load_classifier(builtin_classifier_path())
    fn = clf.pivot_fn()
    if call == "closure":
        return fn
    module_fn = lambda *inputs: clf.predict_proba(*inputs).to(inputs[1].device)  # noqa: E731
    module_fn.hidden_layer = fn.hidden_layer
    return module_fn


if __name__ == "__main__":
    main()
