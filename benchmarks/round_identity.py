"""Whether two source trees' `generate` give the same outputs: token ids, texts, traces, every count of the stats
(no times), the warnings and the one-line errors, over a broad set of settings on the built-in pair (verifier,
drafter-weak; drafter-mtp and prompt lookup for a few), arithmetic prompts:

* AR, strict at N = 3 and 5, every rule at its defaults at N = 3 (PAD with the built-in classifier), greedy and
  T = 0.7 top-p 0.95, batch 1 and 4;
* draft_length="auto", a draft-confidence stop (with fixed N and with auto), a phase (the span until "The answer
  is", with ensemble and with PAD; one that never opens), a length limit shorter than a block, per-prompt seeds;
* bad arguments, alone and two at once (which error comes first).

    python benchmarks/round_identity.py --out after.json [--against before.json] [--quick]
    PYTHONPATH=OTHER/src python benchmarks/round_identity.py --out before.json   # the other tree

--against: compare with another run's JSON, print the settings that differ and exit 1 if any does.
--quick: a few settings only (to see that it runs).
"""

from __future__ import annotations

import json
import sys
import time
import warnings
from dataclasses import asdict

import torch

from harness.options import add, parser

ANSWER = "The answer is"


def settings(quick: bool):
    """(name, drafter name or None, generate's keyword arguments) of every setting."""
    from relaxspec.acceptance import RULES
    sampled = {"temperature": 0.7, "top_p": 0.95}
    out = []
    for sampling_name, sampling in (("greedy", {}), ("T0.7", sampled)):
        for batch in (1, 4):
            run = {**sampling, "batch": batch}
            tag = f"{sampling_name} b{batch}"
            out += [(f"ar {tag}", None, {**run, "method": "ar"}),
                    (f"strict N=3 {tag}", "drafter-weak", {**run, "method": "strict", "draft_length": 3}),
                    (f"strict N=5 {tag}", "drafter-weak", {**run, "method": "strict", "draft_length": 5}),
                    (f"strict auto {tag}", "drafter-weak", {**run, "method": "strict", "draft_length": "auto"}),
                    (f"strict N=4 confidence 0.4 {tag}", "drafter-weak",
                     {**run, "method": "strict", "draft_length": 4, "draft_confidence": 0.4}),
                    (f"typical auto confidence 0.6 {tag}", "drafter-weak",
                     {**run, "method": "typical", "draft_length": "auto", "draft_confidence": 0.6}),
                    (f"ensemble phase {tag}", "drafter-weak",
                     {**run, "method": "ensemble", "weight": 0.3, "draft_length": 3, "phase": (None, ANSWER)}),
                    (f"pad phase {tag}", "drafter-weak",
                     {**run, "method": "pad", "draft_length": 3, "phase": f"..{ANSWER}", "pivot": True}),
                    (f"ensemble phase never opens {tag}", "drafter-weak",
                     {**run, "method": "ensemble", "weight": 0.3, "draft_length": 3, "phase": "QQQ..ZZZ"}),
                    (f"strict N=5 max 7 {tag}", "drafter-weak",
                     {**run, "method": "strict", "draft_length": 5, "max_new_tokens": 7}),
                    (f"strict mtp N=3 {tag}", "drafter-mtp", {**run, "method": "strict", "draft_length": 3}),
                    (f"strict ngram N=3 {tag}", "ngram:n=3", {**run, "method": "strict", "draft_length": 3}),
                    (f"typical mtp auto {tag}", "drafter-mtp", {**run, "method": "typical", "draft_length": "auto"})]
            out += [(f"{rule} N=3 {tag}", "drafter-weak", {**run, "method": rule, "draft_length": 3,
                                                           **({"pivot": True} if rule == "pad" else {})})
                    for rule in sorted(RULES) if rule != "strict"]
    out.append(("strict N=3 T0.7 b4 seeds", "drafter-weak",
                {**sampled, "batch": 4, "method": "strict", "draft_length": 3, "seed": [11, 12, 13, 14]}))
    return out[:6] if quick else out


BAD = [  # (name, drafter name or None, keyword arguments): each a ValueError whose message is compared
    ("unknown method", "drafter-weak", {"method": "nope"}),
    ("draft_length 0", "drafter-weak", {"method": "strict", "draft_length": 0}),
    ("draft_length 2.5", "drafter-weak", {"method": "strict", "draft_length": 2.5}),
    ("temperature -1", "drafter-weak", {"method": "strict", "temperature": -1}),
    ("cactus delta -0.5", "drafter-weak", {"method": "cactus", "delta": -0.5}),
    ("ar with a rule parameter", None, {"method": "ar", "alpha": 0.3}),
    ("ar with draft_confidence", None, {"method": "ar", "draft_confidence": 0.5}),
    ("ar with a pivot_fn", None, {"method": "ar", "pivot": True}),
    ("strict without a drafter", None, {"method": "strict"}),
    ("pad without a pivot_fn", "drafter-weak", {"method": "pad"}),
    ("strict with a pivot_fn", "drafter-weak", {"method": "strict", "pivot": True}),
    ("pad with mtp's layers", "drafter-mtp", {"method": "pad", "pivot": True}),
    ("ngram with a rule that needs q", "ngram:n=3", {"method": "spec-cont-dec"}),
    ("seed list of the wrong length", "drafter-weak", {"method": "strict", "seed": [1, 2]}),
    ("seed a string", "drafter-weak", {"method": "strict", "seed": "x"}),
    ("max_new_tokens 0", "drafter-weak", {"method": "strict", "max_new_tokens": 0}),
    ("draft_confidence 2", "drafter-weak", {"method": "strict", "draft_confidence": 2}),
    ("phase think", "drafter-weak", {"method": "ensemble", "phase": "think"}),
    ("phase id out of vocabulary", "drafter-weak", {"method": "ensemble", "phase": "#100000.."}),
    ("an empty prompt", "drafter-weak", {"method": "strict", "prompts": [""]}),
    ("max_new_tokens past the context", "drafter-weak", {"method": "strict", "max_new_tokens": 10 ** 6}),
    ("bad seed and bad rule parameter", "drafter-weak", {"method": "cactus", "delta": -0.5, "seed": "x"}),
    ("bad rule parameter and bad prompt", "drafter-weak", {"method": "cactus", "delta": -0.5, "prompts": [""]}),
    ("bad temperature and unknown method", "drafter-weak", {"method": "nope", "temperature": -1}),
    ("bad draft_length and bad seed", "drafter-weak", {"method": "strict", "draft_length": 0, "seed": "x"}),
    ("bad seed and a context overflow", "drafter-weak", {"method": "strict", "seed": "x", "max_new_tokens": 10 ** 6}),
]


def result(out) -> dict:
    """What a call gave, without times."""
    times = ("time_draft_s", "time_verify_s", "time_total_s")
    return {"stats": {k: v for k, v in out.stats.as_dict().items() if k not in times},
            "results": [{"token_ids": r.token_ids, "text": r.text, "seed": r.seed, "stats": r.stats.as_dict(),
                         "trace": [asdict(t) for t in r.trace]} for r in out.results]}


def main():
    ap = parser(__doc__)
    ap.add_argument("--out", required=True)
    ap.add_argument("--against", default=None)
    add(ap, max_new_tokens=48, quick=False)
    args = ap.parse_args()
    torch.set_num_threads(1)
    import relaxspec
    from relaxspec.drafters import load_drafter
    from relaxspec.engine import generate
    from relaxspec.models import load_model
    from relaxspec.pivot import builtin_classifier_path, load_classifier
    from relaxspec.tasks import get_task

    verifier = load_model("verifier")
    drafters = {}
    pivot_fn = load_classifier(builtin_classifier_path()).pivot_fn()
    prompts = [e.prompt for e in get_task("arithmetic", limit=4).examples]

    def call(drafter, kw):
        kw = dict(kw)
        batch, chosen = kw.pop("batch", 1), kw.pop("prompts", None)
        if kw.pop("pivot", False):
            kw["pivot_fn"] = pivot_fn
        kw.setdefault("max_new_tokens", args.max_new_tokens)
        if drafter is not None and drafter not in drafters:
            drafters[drafter] = load_drafter(drafter, verifier)
        # (a rule whose greedy form still draws, ensemble's, gets no seeded draws from generate at temperature 0: it
        # draws from torch's global generator, seeded here so that both trees draw alike)
        torch.manual_seed(0)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            out = generate(verifier, None if drafter is None else drafters[drafter], chosen or prompts[:batch], **kw)
        return {**result(out), "warnings": [str(w.message) for w in caught]}

    def outcome(drafter, kw):
        try:
            return call(drafter, kw)
        except Exception as e:  # (BAD's a ValueError each; any other is reported as it is)
            return f"{type(e).__name__}: {e}"

    runs, t0 = {}, time.perf_counter()
    for name, drafter, kw in settings(args.quick):
        runs[name] = outcome(drafter, kw)
    for name, drafter, kw in BAD[:3] if args.quick else BAD:
        runs["error: " + name] = outcome(drafter, kw)
    failed = sorted(name for name, run in runs.items() if not name.startswith("error: ") and isinstance(run, str))
    eos_ended = sum(r["stats"]["emitted_tokens"] > r["stats"]["generated_tokens"]
                    for run in runs.values() if isinstance(run, dict) for r in run["results"])
    print(f"{relaxspec.__file__}: {len(runs)} settings in {time.perf_counter() - t0:.0f} s; "
          f"{eos_ended} sequences ended at EOS" + (f"; settings that raised: {failed}" if failed else ""))
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(runs, f, indent=1, sort_keys=True)
    if args.against:
        with open(args.against, encoding="utf-8") as f:
            other = json.load(f)
        differ = sorted(name for name in set(runs) | set(other) if runs.get(name) != other.get(name))
        for name in differ:
            print(f"differs: {name}")
        print(f"identical: {len(runs) - len(differ)} of {len(set(runs) | set(other))} settings against {args.against}")
        sys.exit(1 if differ else 0)


if __name__ == "__main__":
    main()
