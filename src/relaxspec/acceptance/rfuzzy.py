"""Reducible fuzzy SD, r-fuzzy: π = q if JSD(p, q) <= T else p.

Gate passes: accept unconditionally (π/q = 1). Gate fails: the strict test
with residual (p - q)+. Same output marginal as FSD, never less acceptance;
T < 0 is strict.
"""

import torch

from relaxspec.acceptance.base import ParamSpec, Positions, Rule, register
from relaxspec.acceptance.processing import capped_ratio, jsd


@register
class RFuzzyRule(Rule):
    name = "r-fuzzy"
    description = "r-fuzzy: accept if JSD(p,q) <= T, else the strict test."
    params = {
        "threshold": ParamSpec(
            "threshold", 0.2, strict_value=-1.0, grid=(0.05, 0.2, 0.3),
            doc="JSD threshold in nats; any T < 0 is strict",
        )
    }

    def accept_prob(self, pos: Positions, *, threshold: float) -> torch.Tensor:
        gate = jsd(pos.p, pos.q) <= threshold
        return torch.where(gate, 1.0, capped_ratio(pos.p_x, pos.q_x))
