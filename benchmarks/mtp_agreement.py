"""Where an MTP head loses tau: its greedy agreement with the verifier at each draft depth, teacher-forced.

    PYTHONPATH=src python benchmarks/mtp_agreement.py [--verifier verifier] [--drafter drafter-mtp]
        [--task arithmetic --task sorting | --task chat] [--n 60] [--max-new-tokens 160] [--depths 6]

The verifier answers n held-out prompts greedily (the test split of a synthetic task, or the held-out chat
prompts through the chat template), keeping its last hidden state of every token. Depth 1 feeds the head
the verifier's own features (as right after a verify step) and asks, at every answer position, whether the
head's greedy token is the verifier's; depth d feeds it its own output features of depth d - 1 (as d - 1
draft steps into a round): training's unroll passes (`training.mtp.unrolled_outputs`). The verifier's token is its argmax over
the whole vocabulary, so a truncated head is charged for tokens it cannot propose.
"""

from __future__ import annotations


import torch

from harness.options import add, parser
from relaxspec.models import load_model
from relaxspec.drafters import load_drafter
from relaxspec.drafters.mtp import MTPDrafter, head_rows, verifier_weights
from relaxspec.training.mtp import TrainConfig, final_features, self_distillation_data, unrolled_outputs


def held_out_prompts(task: str, n: int) -> list[str]:
    if task == "chat":
        from relaxspec.tasks import chat

        return chat.HELDOUT[:n]
    from relaxspec.tasks import synthetic

    return [e.prompt for e in synthetic.examples(task, "test", n)]


@torch.inference_mode()
def agreement(verifier, drafter: MTPDrafter, prompts: list[str], max_new_tokens: int, depths: int) -> list[float]:
    """Share of answer positions where the head's greedy token equals the verifier's, at depths 1..`depths`."""
    data = self_distillation_data(verifier, prompts, TrainConfig(temperature=0, max_new_tokens=max_new_tokens),
                                  hidden_layers=drafter.hidden_layers)
    head = drafter.head.float()
    embed, lm_head = (w.detach().float() for w in verifier_weights(verifier))
    rows = head_rows(head, lm_head)
    ids = head.draft_vocab if head.cfg.draft_vocab else torch.arange(lm_head.shape[0])
    hits, total = [0] * depths, 0
    for tokens, features, start in zip(data["tokens"], data["features"], data["answer_start"]):
        tokens, features = tokens[None], features.float()[None]
        S = tokens.shape[1]
        scored = slice(max(0, start - 2), S - 2)  # entries whose target (a token after the prompt's last) exists
        target = (final_features(features, embed.shape[1])[:, 1:] @ lm_head.t()).argmax(dim=-1)[0, scored]
        valid = torch.ones((1, S), dtype=torch.long)
        for d, out in enumerate(unrolled_outputs(head, tokens, features, valid, embed, depths)):
            guess = ids[(out @ rows.t()).argmax(dim=-1)[0, scored]]
            hits[d] += int((guess == target).sum())
        total += target.numel()
    return [h / max(total, 1) for h in hits]


def main() -> None:
    ap = parser(__doc__)
    add(ap, verifier="verifier", drafter=("drafter-mtp", "an MTP head: a built-in name or a directory"))
    ap.add_argument("--task", action="append", help="arithmetic, sorting or chat (repeatable)")
    add(ap, n=60, max_new_tokens=160, depths=6, threads=1)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    verifier = load_model(a.verifier)
    drafter = load_drafter(a.drafter, verifier)
    if not isinstance(drafter, MTPDrafter):
        ap.error(f"{a.drafter!r} is a drafter of kind {drafter.kind!r}, not an MTP head")
    print(f"{a.drafter} for {a.verifier}: greedy agreement with the verifier by draft depth (teacher-forced)")
    for task in a.task or ["arithmetic", "sorting"]:
        rates = agreement(verifier, drafter, held_out_prompts(task, a.n), a.max_new_tokens, a.depths)
        print(f"  {task:10s} " + "  ".join(f"d{d + 1} {r:.3f}" for d, r in enumerate(rates)), flush=True)


if __name__ == "__main__":
    main()
