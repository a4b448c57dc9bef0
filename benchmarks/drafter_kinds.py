"""Strict greedy tau and c_rel of each drafter kind against the built-in verifier.

    PYTHONPATH=src python benchmarks/drafter_kinds.py [--n 50] [--draft-length 5] [--drafters ...] [--temperature 0]

tau: mean acceptance length (bonus included) of strict decoding (greedy, or sampled at --temperature
with seed 0) on n held-out problems of
each task; c_rel: the drafter's cost of one drafted token over one verifier step, both measured
here: `measure_draft_latency` (seconds per drafted token through the drafter protocol) over the
verifier's `measure_step_latency` (a one-token step after 128 tokens of context), one thread.
"""

from __future__ import annotations

import argparse

import torch

from harness.options import add
from relaxspec.engine import generate
from relaxspec.models import load_model, measure_step_latency
from relaxspec.drafters import load_drafter, measure_draft_latency
from relaxspec.tasks import synthetic


def main() -> None:
    ap = argparse.ArgumentParser()
    add(ap, n=50, draft_length=5)
    ap.add_argument("--drafters", nargs="*", default=["drafter-mtp", "drafter-strong", "drafter-weak", "ngram"])
    ap.add_argument("--tasks", nargs="*", default=["arithmetic", "sorting"])
    ap.add_argument("--temperature", type=float, default=0.0, help="0: greedy")
    a = ap.parse_args()
    torch.set_num_threads(1)
    verifier = load_model("verifier")
    step = measure_step_latency(verifier)
    how = "greedy" if a.temperature == 0 else f"T={a.temperature:g}"
    print(f"verifier step {step * 1e3:.3f} ms; strict {how}, N={a.draft_length}, {a.n} held-out problems per task")
    print(f"{'drafter':16s} {'kind':6s} {'c_rel':>6s} " + " ".join(f"{'tau ' + t:>16s}" for t in a.tasks))
    for name in a.drafters:
        drafter = load_drafter(name, verifier)
        c_rel = measure_draft_latency(drafter, verifier) / step
        taus = []
        for task in a.tasks:
            prompts = [e.prompt for e in synthetic.examples(task, "test", a.n)]
            out = generate(verifier, drafter, prompts, method="strict", draft_length=a.draft_length,
                           max_new_tokens=160, temperature=a.temperature, seed=0)
            taus.append(out.stats.mean_acceptance_length)
        print(f"{name:16s} {drafter.kind:6s} {c_rel:6.3f} " + " ".join(f"{t:16.2f}" for t in taus))


if __name__ == "__main__":
    main()
