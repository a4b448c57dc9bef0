"""Speculative contrastive decoding (Yuan et al., ACL 2024), support-gated variant.

π = softmax(((1+β)·z_p - β·z_q) / T) restricted to the support of the processed
p (renormalised); z are raw logits. Accept min(1, π(x)/q(x)); residual
(π - q)+; bonus π at the bonus position, which needs the drafter's row there:
draft_logits [B, N+1, V], one extra drafter pass per round (`extra_draft_passes`).
Without it `verify` raises (no silent fall-back to p). β = 0 gives π = p: strict.
At temperature 0 the support of p is the verifier's argmax, so π = p.

Scores that overflow (β so large that finite logits give ±inf) are an error, as in
the reference. A drafter logit of -inf inside the support is not an overflow: the
contrast is +inf there, and the limit puts all mass, uniformly, on those tokens.
Refused with a one-hot q: the contrast needs the drafter's logits.
"""

import math

import torch

from relaxspec.acceptance.base import ParamSpec, Positions, Rule, VerifyContext, register
from relaxspec.acceptance.processing import NEG_INF, at_tokens, capped_ratio, is_greedy


def contrastive_target(
    z_p: torch.Tensor, z_q: torch.Tensor, p: torch.Tensor, beta: float, temperature: float
) -> torch.Tensor:
    if beta == 0 or is_greedy(temperature):
        return p  # exactly strict (and avoids 0·(-inf) for masked drafter logits)
    off_support = p <= 0  # (p >= 0: the complement of the support p > 0)
    scores = ((1.0 + beta) * z_p - beta * z_q) / temperature
    # Finite on the support (the common case): one pass finds it (the largest |score| there; NaN propagates).
    if not math.isfinite(torch.linalg.vector_norm(scores.masked_fill(off_support, 0.0), ord=math.inf)):
        return _banned_or_overflow(z_q, scores, off_support, beta, temperature)
    return scores.masked_fill_(off_support, NEG_INF).softmax(dim=-1)


def _banned_or_overflow(z_q, scores, off_support, beta: float, temperature: float) -> torch.Tensor:
    """contrastive_target where a score on the support is not finite: drafter logits of -inf there (each such row
    puts all its mass, uniformly, on those tokens), else an overflow (ValueError)."""
    amateur_banned = ~off_support & torch.isneginf(z_q)
    if bool((~off_support & ~amateur_banned & ~torch.isfinite(scores)).any()):
        raise ValueError(
            f"rule 'spec-cont-dec': contrast scores overflow at beta={beta:g}, temperature={temperature:g} "
            f"(((1+beta)·z_p - beta·z_q)/T is not finite); use a smaller beta"
        )
    scores = scores.masked_fill(off_support, NEG_INF)  # also clears NaN from (-inf) - (-inf)
    scores = torch.where(amateur_banned.any(dim=-1, keepdim=True),
                         torch.where(amateur_banned, 0.0, NEG_INF), scores)
    return scores.softmax(dim=-1)


@register
class SpecContDecRule(Rule):
    name = "spec-cont-dec"
    description = "Speculative contrastive decoding: π ∝ exp(((1+β)z_p - βz_q)/T) on the support of p."
    params = {
        "beta": ParamSpec(
            "beta", 0.5, low=0.0, high=math.inf, high_inclusive=False, strict_value=0.0, grid=(0.1, 0.5, 1.0),
            doc="contrast strength; 0 is strict",
        )
    }
    extra_draft_passes = 1
    valid_with_one_hot_q = False
    one_hot_q = "the contrast (1+β)z_p - βz_q needs the drafter's logits, which a point mass does not have"
    at_greedy = "the support of p is its argmax, so π = p: exactly strict"

    def _target(self, pos: Positions, beta: float) -> torch.Tensor:
        # Once per block (the whole block's positions [B, N+1, ...]), over the positions the drafter gave logits for
        # (the bonus position too, where it gave N+1 rows): the residual row and the bonus read theirs.
        def compute(pos: Positions) -> torch.Tensor:
            rows = pos.z_q.shape[1]
            return contrastive_target(pos.z_p[:, :rows], pos.z_q, pos.p[:, :rows], beta, pos.temperature)
        return pos.shared(("spec-cont-dec", beta), compute, whole_block=True)

    def accept_prob(self, pos: Positions, *, beta: float) -> torch.Tensor:
        return capped_ratio(at_tokens(self._target(pos, beta), pos.x), pos.q_x)

    def residual(self, pos: Positions, *, beta: float) -> torch.Tensor:
        return (self._target(pos, beta) - pos.q).clamp_min_(0.0)

    def bonus(self, ctx: VerifyContext, *, beta: float) -> torch.Tensor:
        return self._target(ctx.whole(), beta)[:, ctx.p.shape[1] - 1]  # (the drafter's row there: validate checks)

    # π in C from the same float32 scores (scalars as float32, as torch's) and the sampler's exp: its values within
    # float32 rounding of torch's softmax. A score that is not finite on the support, save the drafter's -inf (all the
    # mass, uniformly, on those tokens, as above), declines the block: the torch path then raises the overflow.
    native_test = "spec_cont_dec.c"  # csrc/rules/spec_cont_dec.c
    native_residual = True
    native_bonus = True
