"""Static ensemble verification: target F = w·p + (1-w)·q.

accept min(1, (1-w) + w·p(x)/q(x)); residual (F - q)+ ∝ (p - q)+ (the default,
independent of w); bonus p. The output law is exactly F. w = 1 is strict,
w = 0 always accepts.
"""

import torch

from relaxspec.acceptance.base import ParamSpec, Positions, Rule, register
from relaxspec.acceptance.processing import capped_ratio


@register
class EnsembleRule(Rule):
    name = "ensemble"
    description = "Static ensemble: output law w·p + (1-w)·q; accept min(1, (1-w) + w·p(x)/q(x))."
    params = {
        "weight": ParamSpec(
            "weight", 0.9, low=0.0, high=1.0, strict_value=1.0, grid=(0.8, 0.9, 0.95),
            doc="verifier weight w; 1 is strict, 0 always accepts",
        )
    }

    def accept_prob(self, pos: Positions, *, weight: float) -> torch.Tensor:
        # (1-w) + w·min(1, r) equals min(1, (1-w) + w·r) and never meets 0·inf.
        return (1.0 - weight) + weight * capped_ratio(pos.p_x, pos.q_x)
