"""Strict greedy tau and c_rel of each drafter kind against the built-in verifier.

    PYTHONPATH=src python benchmarks/drafter_kinds.py [--n 50] [--draft-length 5] [--drafters ...]

tau: mean acceptance length (bonus included) of strict greedy decoding on n held-out problems of
each task; c_rel: the drafter's cost of one drafted token over one verifier step, both measured
here (median of a one-token step after 128 tokens of context, one thread, as `models list`).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from relaxspec.engine import generate
from relaxspec.models import load_model, measure_step_latency
from relaxspec.models.drafters import load_drafter
from relaxspec.tasks import synthetic


def draft_cost(verifier, drafter, context: int = 128, rounds: int = 30, n: int = 5) -> float:
    """Median seconds per drafted token: prefill `context` tokens, then propose n, roll back to 2
    accepted, repeat (the context grows by 3 tokens a round, as in a real run)."""
    ids = torch.randint(2, verifier.vocab_size, (1, context + 1))
    mask = torch.ones_like(ids)
    hidden = None
    if drafter.needs_hidden:
        _, hidden = verifier.forward(ids[:, :-1], verifier.new_cache(), mask[:, :-1],
                                     torch.arange(context)[None], hidden_layer=-1)
    drafter.prefill(ids[:, :-1], mask[:, :-1], hidden)
    greedy = lambda logits, i: (logits.argmax(-1), None)  # noqa: E731
    times = []
    for _ in range(rounds + 3):
        t = time.perf_counter()
        proposal = drafter.propose(ids[:, -1], n, 0, greedy)
        times.append((time.perf_counter() - t) / n)
        accepted = torch.tensor([2])  # a typical round: the next one re-feeds 3 entries (MTP) / none (LM)
        drafter.rollback(accepted, None if hidden is None else hidden[:, -1:].expand(1, n + 1, -1))
        del proposal
    return statistics.median(times[3:])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=50)
    ap.add_argument("--draft-length", type=int, default=5)
    ap.add_argument("--drafters", nargs="*", default=["drafter-mtp", "drafter-strong", "drafter-weak", "ngram"])
    ap.add_argument("--tasks", nargs="*", default=["arithmetic", "sorting"])
    a = ap.parse_args()
    torch.set_num_threads(1)
    verifier = load_model("verifier")
    step = measure_step_latency(verifier)
    print(f"verifier step {step * 1e3:.3f} ms; strict greedy, N={a.draft_length}, {a.n} held-out problems per task")
    print(f"{'drafter':16s} {'kind':6s} {'c_rel':>6s} " + " ".join(f"{'tau ' + t:>16s}" for t in a.tasks))
    for name in a.drafters:
        drafter = load_drafter(name, verifier)
        c_rel = draft_cost(verifier, drafter) / step
        taus = []
        for task in a.tasks:
            prompts = [e.prompt for e in synthetic.examples(task, "test", a.n)]
            out = generate(verifier, drafter, prompts, method="strict", draft_length=a.draft_length,
                           max_new_tokens=160)
            taus.append(out.stats.mean_acceptance_length)
        print(f"{name:16s} {drafter.kind:6s} {c_rel:6.3f} " + " ".join(f"{t:16.2f}" for t in taus))


if __name__ == "__main__":
    main()
