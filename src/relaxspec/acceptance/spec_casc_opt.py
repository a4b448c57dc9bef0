"""Speculative cascades, "opt" deferral (Narasimhan et al., ICLR 2025, colab Eq. 10).

π = q if max q >= max p - α·TV(p, q) else p, on processed probabilities.
π = q accepts unconditionally; π = p is the strict test with residual (p - q)+.
α = -inf is strict.
"""

import math

import torch

from relaxspec.acceptance.base import ParamSpec, Positions, Rule, register
from relaxspec.acceptance.processing import capped_ratio, total_variation


@register
class SpecCascOptRule(Rule):
    name = "spec-casc-opt"
    description = "Speculative cascade (opt): keep the draft if max q >= max p - α·TV(p,q), else strict."
    params = {
        "alpha": ParamSpec(
            "alpha", 0.0, strict_value=-math.inf, grid=(-0.1, 0.0, 0.05),
            doc="deferral slack; -inf is strict",
        )
    }

    def accept_prob(self, pos: Positions, *, alpha: float) -> torch.Tensor:
        strict = capped_ratio(pos.p_x, pos.q_x)
        if alpha == -math.inf:
            return strict
        tv = total_variation(pos.p, pos.q)
        # TV = 0 with α = ±inf would be inf·0 = NaN; the slack is 0 there.
        slack = torch.where(tv > 0, alpha * tv, 0.0)
        gate = pos.q.amax(dim=-1) >= pos.p.amax(dim=-1) - slack
        return torch.where(gate, 1.0, strict)
