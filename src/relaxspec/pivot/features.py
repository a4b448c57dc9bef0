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


def candidate_features(hidden: torch.Tensor, target_logits: torch.Tensor, draft_logits: torch.Tensor,
                       tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """hidden [..., H], target_logits [..., V], draft_logits [..., V], tokens [...] (long) ->
    (hidden [..., H] float32, scalars [..., 6] float32 in the order of SCALAR_FEATURES).
    Both distributions go through each op together (one log_softmax, exp, gather and sum over [2, ..., V]: the
    same values as one at a time, in half the calls, which the classifier pays once per round). No autograd
    graph unless an input requires grad (callers run under inference_mode / no_grad, or pass model outputs)."""
    if target_logits.shape != draft_logits.shape:
        raise ValueError(f"target_logits {list(target_logits.shape)} and draft_logits "
                         f"{list(draft_logits.shape)} must have the same shape")
    if hidden.shape[:-1] != target_logits.shape[:-1] or tokens.shape != target_logits.shape[:-1]:
        raise ValueError(f"leading shapes differ: hidden {list(hidden.shape)}, logits "
                         f"{list(target_logits.shape)}, tokens {list(tokens.shape)}")
    # [..., 1] pieces (keepdim), joined along the last dimension: no squeeze per piece
    logs = torch.log_softmax(torch.stack([target_logits, draft_logits]).float(), dim=-1)  # [2, ..., V]: log p, log q
    logp = logs[0]
    at_x = logs.gather(-1, tokens.long().unsqueeze(-1).expand(logs.shape[:-1] + (1,)))  # [2, ..., 1]
    p_x, q_x = at_x.exp()
    entropy_p, entropy_q = (logs.exp() * logs).sum(dim=-1, keepdim=True).neg_()
    p_top = logp.amax(dim=-1, keepdim=True).exp()
    rank = (logp > at_x[0]).sum(dim=-1, keepdim=True, dtype=torch.float32)  # tokens with p strictly above p(x)
    return hidden.float(), torch.cat([p_x, q_x, p_top, entropy_p, entropy_q, torch.log1p(rank)], dim=-1)
