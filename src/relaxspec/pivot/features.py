"""The one feature function PAD uses, both when labelling pivots and when decoding.

For a candidate token x (a drafted token) the features are the verifier's hidden
state at x's own position (after feeding x) and six scalars computed from the
raw logits at temperature 1:

    p(x), q(x), max p, H(p), H(q), log(1 + rank of x under p)

where p is the verifier's distribution for x (the row of logits that predicts
x), q the drafter's, and rank counts tokens with p strictly above p(x) (0 when x
is the verifier's top choice). Temperature 1 on the *raw* logits keeps the
features independent of the decoding temperature.
"""

from __future__ import annotations

import torch

SCALAR_FEATURES = ("p_x", "q_x", "p_top", "entropy_p", "entropy_q", "log1p_rank_p")


def _entropy(logp: torch.Tensor) -> torch.Tensor:
    return -(logp.exp() * logp).sum(dim=-1)


@torch.no_grad()
def candidate_features(hidden: torch.Tensor, target_logits: torch.Tensor, draft_logits: torch.Tensor,
                       tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """hidden [..., H], target_logits [..., V], draft_logits [..., V], tokens [...] (long) ->
    (hidden [..., H] float32, scalars [..., 6] float32 in the order of SCALAR_FEATURES)."""
    if target_logits.shape != draft_logits.shape:
        raise ValueError(f"target_logits {list(target_logits.shape)} and draft_logits "
                         f"{list(draft_logits.shape)} must have the same shape")
    if hidden.shape[:-1] != target_logits.shape[:-1] or tokens.shape != target_logits.shape[:-1]:
        raise ValueError(f"leading shapes differ: hidden {list(hidden.shape)}, logits "
                         f"{list(target_logits.shape)}, tokens {list(tokens.shape)}")
    logp = torch.log_softmax(target_logits.float(), dim=-1)
    logq = torch.log_softmax(draft_logits.float(), dim=-1)
    idx = tokens.long().unsqueeze(-1)
    logp_x = logp.gather(-1, idx)
    p_x = logp_x.squeeze(-1).exp()
    q_x = logq.gather(-1, idx).squeeze(-1).exp()
    p_top = logp.max(dim=-1).values.exp()
    rank = (logp > logp_x).sum(dim=-1).float()
    scalars = torch.stack([p_x, q_x, p_top, _entropy(logp), _entropy(logq), torch.log1p(rank)], dim=-1)
    return hidden.float(), scalars
