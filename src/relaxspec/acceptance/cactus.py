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


def cactus_h(pos: Positions, delta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(h, 1 - p(x)), once per block (`Positions.shared`). p(x) is in [0, 1] (processed: a probability never
    exceeds 1), so 2·δ·p(x)(1-p(x)) >= 0 and its square root needs no clamp at 0 (the same bits as with one)."""
    def compute(pos: Positions):
        rest = 1.0 - pos.p_x
        return (pos.p_x + (2.0 * delta * pos.p_x * rest).sqrt_()).clamp_(max=1.0), rest
    return pos.shared(("cactus", delta), compute)


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
        h, _ = cactus_h(pos, delta)
        return capped_ratio(h, pos.q_x)

    def residual(self, pos: Positions, *, delta: float) -> torch.Tensor:
        # (H_x - q)+: the rest of p rescaled, (p·scale - q)+, and (h - q(x))+ at x.
        h, rest = cactus_h(pos, delta)
        # p(x) = 1 leaves nothing to rescale (and h = 1): H_x = p, scale 1 where (1-h)/(1-p(x)) is 0/0.
        scale = ((1.0 - h) / rest).nan_to_num_(nan=1.0)
        H = (pos.p * scale.unsqueeze(-1)).scatter_(-1, pos.x.unsqueeze(-1), h.unsqueeze(-1))
        return H.sub_(pos.q).clamp_min_(0.0)

    # The same float32 operations as cactus_h, accept_prob and residual above.
    native_test = "cactus.c"  # csrc/rules/cactus.c
    native_residual = True
