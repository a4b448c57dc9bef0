"""Speculative contrastive decoding (Yuan et al., ACL 2024), support-gated variant.

π = softmax(((1+β)·z_p - β·z_q) / T) restricted to the support of the processed
p (renormalised); z are raw logits. Accept min(1, π(x)/q(x)); residual
(π - q)+; bonus π at the bonus position when draft_logits carries the drafter's
row there (one extra drafter pass), else p. β = 0 gives π = p: strict.
With temperature 0 the support of p is the verifier's argmax, so π = p.
"""

import math

import torch

from relaxspec.acceptance.base import ParamSpec, Positions, Rule, VerifyContext, register
from relaxspec.acceptance.processing import NEG_INF, capped_ratio, one_hot_argmax


def contrastive_target(
    z_p: torch.Tensor, z_q: torch.Tensor, p: torch.Tensor, beta: float, temperature: float
) -> torch.Tensor:
    if beta == 0:
        return p  # exactly strict (and avoids 0·(-inf) for masked drafter logits)
    c = (1.0 + beta) * z_p - beta * z_q
    c = c.masked_fill(p <= 0, NEG_INF)  # also clears NaN from (-inf) - (-inf)
    # Inside the support a drafter logit of -inf gives +inf: the limit puts all
    # mass, uniformly, on those tokens.
    pos_inf = torch.isposinf(c)
    c = torch.where(pos_inf.any(dim=-1, keepdim=True), torch.where(pos_inf, 0.0, NEG_INF), c)
    if temperature == 0:
        return one_hot_argmax(c)
    return (c / temperature).softmax(dim=-1)


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
    extra_draft_passes = 1  # the bonus distribution needs the drafter's row at the bonus position

    def _target(self, pos: Positions, beta: float) -> torch.Tensor:
        return contrastive_target(pos.z_p, pos.z_q, pos.p, beta, pos.temperature)

    def accept_prob(self, pos: Positions, *, beta: float) -> torch.Tensor:
        pi_x = self._target(pos, beta).gather(-1, pos.x.unsqueeze(-1)).squeeze(-1)
        return capped_ratio(pi_x, pos.q_x)

    def residual(self, pos: Positions, *, beta: float) -> torch.Tensor:
        return (self._target(pos, beta) - pos.q).clamp_min(0.0)

    def bonus(self, ctx: VerifyContext, *, beta: float) -> torch.Tensor:
        if not ctx.has_bonus_draft:
            return ctx.p[:, -1]
        return contrastive_target(
            ctx.target_logits[:, -1], ctx.draft_logits[:, -1], ctx.p[:, -1], beta, ctx.temperature
        )
