"""The built-in `smollm2-drafter` against SmolLM2-135M-Instruct: strict greedy tau and c_rel, truncated
vs full LM head.

    PYTHONPATH=src python benchmarks/smollm2_drafter.py [--verifier smollm2] [--n 3 5 8] [--threads 1] [--full-n 5]

tau: mean acceptance length (bonus included) of strict greedy decoding of the 20 held-out chat prompts
(`tasks.chat.HELDOUT`, never trained on) through the chat template, 128 new tokens, one batch.
c_rel: seconds per drafted token through the drafter protocol (batch 1, N=5) over the verifier's one-token
step after 128 tokens of context, interleaved round by round and taken as the median of the within-round
ratio (bench.cell.speed_constants, as `relaxspec bench` does), for the shipped head (truncated vocabulary)
and the same head scoring the verifier's full LM head.
"""

from __future__ import annotations

import argparse
import dataclasses
import time

import torch

from harness.options import add
from harness.timing import strict_constants
from relaxspec.engine import generate
from relaxspec.models import load_model
from relaxspec.drafters import load_drafter
from relaxspec.drafters.mtp import MTPDrafter, MTPHead
from relaxspec.tasks import chat


def full_vocabulary(drafter: MTPDrafter, verifier) -> MTPDrafter:
    """The same head over the verifier's whole LM head (q no longer truncated)."""
    head = MTPHead(dataclasses.replace(drafter.head.cfg, draft_vocab=0))
    head.load_state_dict({k: v for k, v in drafter.head.state_dict().items() if k != "draft_vocab"})
    return MTPDrafter(head, verifier, name=f"{drafter.name} (full vocabulary)")


def main() -> None:
    ap = argparse.ArgumentParser()
    add(ap, verifier="smollm2", drafter="smollm2-drafter")
    ap.add_argument("--n", type=int, nargs="*", default=[3, 5, 8], help="draft lengths")
    add(ap, max_new_tokens=128, threads=1)
    ap.add_argument("--full-n", type=int, nargs="*", default=[], help="draft lengths at which to also measure the tau "
                    "of the same head over the full vocabulary")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    verifier = load_model(a.verifier)
    drafter = load_drafter(a.drafter, verifier)
    variants = [("truncated" if drafter.draft_vocab is not None else "full", drafter)]
    if drafter.draft_vocab is not None:
        variants.append(("full", full_vocabulary(drafter, verifier)))
    # c_rel as `relaxspec bench` measures it (bench.cell.speed_constants): the verifier's step and each head's
    # drafting (per drafted token, through the protocol) interleaved, the median of the within-round ratio.
    speed = strict_constants(verifier.name, verifier, dict(variants), [(label, 5) for label, _ in variants])
    step = speed[(verifier.name, variants[0][0], 5)]["latency_verifier_s"]
    print(f"{a.drafter} for {a.verifier}: verifier step {step * 1e3:.1f} ms, {a.threads} thread(s)")
    for label, d in variants:
        k = len(d.draft_vocab) if d.draft_vocab is not None else verifier.vocab_size
        const = speed[(verifier.name, label, 5)]
        print(f"  {label:9s} head (K={k:5d}): {const['latency_drafter_s'] * 1e3:6.2f} ms per drafted token, "
              f"c_rel {const['c_rel_measured']:.3f}")
    print(f"strict greedy on {len(chat.HELDOUT)} held-out chat prompts, {a.max_new_tokens} new tokens:")
    for (label, d), lengths in zip(variants, [a.n, a.full_n]):
        for n in lengths:
            t = time.perf_counter()
            out = generate(verifier, d, chat.HELDOUT, method="strict", draft_length=n, max_new_tokens=a.max_new_tokens)
            tokens = torch.tensor([t for r in out.results for t in r.token_ids])
            coverage = 1.0 if d.draft_vocab is None else float(torch.isin(tokens, d.draft_vocab).float().mean())
            print(f"  {label:9s} N={n}: tau {out.stats.mean_acceptance_length:.2f} "
                  f"(acceptance rate {out.stats.acceptance_rate:.3f}, {len(tokens)} tokens, "
                  f"{coverage:.1%} of them in the head's vocabulary, {time.perf_counter() - t:.0f} s)", flush=True)


if __name__ == "__main__":
    main()
