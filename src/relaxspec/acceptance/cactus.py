"""CACTUS (Hao & Mou, ICLR 2026): a proposal-conditioned target H_x.

h = clip(p(x) + sqrt(2·δ·p(x)(1-p(x))), 0, 1) is the closed-form most-accepting
target within a (second-order) divergence budget δ; H_x(x) = h and the rest of
p is rescaled by (1-h)/(1-p(x)). Accept min(1, h/q(x)); residual (H_x - q)+.
δ = 0 gives h = p(x) and H_x = p: strict.
"""

import math

import torch

from relaxspec.acceptance.base import ParamSpec, Positions, Rule, register
from relaxspec.acceptance.processing import capped_ratio


def cactus_h(p_x: torch.Tensor, delta: float) -> torch.Tensor:
    boost = (2.0 * delta * p_x * (1.0 - p_x)).clamp_min(0.0).sqrt()
    return (p_x + boost).clamp(0.0, 1.0)


@register
class CactusRule(Rule):
    name = "cactus"
    description = "CACTUS: boost p(x) to h = p(x)+sqrt(2δp(x)(1-p(x))), rescale the rest of p."
    accepts_at_least_strict = True  # h(x) >= p(x)
    params = {
        "delta": ParamSpec(
            "delta", 1.0, low=0.0, high=math.inf, high_inclusive=False, strict_value=0.0, grid=(0.1, 0.25, 1.0, 10.0),
            doc="divergence budget; 0 is strict",
        )
    }
    one_hot_q = "accept min(1, h) with h >= p(x); the output law is H_x, within the budget"
    at_greedy = "p one-hot, so h = p(x): exactly strict"

    def accept_prob(self, pos: Positions, *, delta: float) -> torch.Tensor:
        return capped_ratio(cactus_h(pos.p_x, delta), pos.q_x)

    def residual(self, pos: Positions, *, delta: float) -> torch.Tensor:
        h = cactus_h(pos.p_x, delta)
        rest = 1.0 - pos.p_x
        # p(x) = 1 leaves nothing to rescale (and h = 1): H_x = p.
        scale = torch.where(rest > 0, (1.0 - h) / torch.where(rest > 0, rest, 1.0), 1.0)
        H = (pos.p * scale.unsqueeze(-1)).scatter(-1, pos.x.unsqueeze(-1), h.unsqueeze(-1))
        return (H - pos.q).clamp_min(0.0)
