"""Reducible fuzzy SD, r-fuzzy: π = q if JSD(p, q) <= T else p.

Gate passes: accept unconditionally (π/q = 1; q(x) = 0 is still rejected). Gate
fails: the strict test with residual (p - q)+. Same output marginal as FSD, never
less acceptance. T >= 0 as in the reference; T = 0 is strict (the gate then passes
only where p = q, where the strict test accepts too).
"""

import math

import torch

from relaxspec.acceptance.base import ParamSpec, Positions, Rule, register
from relaxspec.acceptance.processing import accept_or_strict, jsd


@register
class RFuzzyRule(Rule):
    name = "r-fuzzy"
    description = "r-fuzzy: accept if JSD(p,q) <= T, else the strict test."
    trusts_q = True  # the JSD gate accepts any draft, p(x) = 0 included
    accepts_at_least_strict = True
    params = {
        "threshold": ParamSpec(
            "threshold", 0.2, low=0.0, high=math.inf, strict_value=0.0, grid=(0.05, 0.2, 0.3),
            doc="JSD threshold in nats; 0 is strict",
        )
    }
    one_hot_q = "accept if JSD(p, δ_x) <= T (p concentrated on x), else min(1, p(x))"
    at_greedy = "JSD is 0 (argmaxes agree) or ln 2: strict for T < ln 2; T >= ln 2 accepts every draft"

    def greedy_point(self, params: dict) -> dict | None:
        return None if params.get("threshold", self.params["threshold"].default) < math.log(2) else dict(params)

    def accept_prob(self, pos: Positions, *, threshold: float) -> torch.Tensor:
        return accept_or_strict(jsd(pos.p, pos.q) <= threshold, pos.p_x, pos.q_x)

    # The JSD in float64 (the sampler's jsd): within float32 rounding of processing.jsd; accept_or_strict's values.
    native_test = "rfuzzy.c"  # csrc/rules/rfuzzy.c
