"""Fuzzy speculative decoding, FSD (Holsman, Huang, Dhingra, Findings ACL 2025).

Accept the draft iff JSD(p, q) < T at that position; otherwise resample from p
(no residual). T >= 0 as in the reference; T = 0 never accepts: autoregressive
decoding from p (lossless, but no speed-up). Its reducible variant is `r-fuzzy`.
"""

import math

import torch

from relaxspec.acceptance.base import ParamSpec, Positions, Rule, register
from relaxspec.acceptance.processing import jsd


@register
class FuzzyRule(Rule):
    name = "fuzzy"
    description = "FSD: accept iff JSD(p,q) < T, else resample from p."
    trusts_q = True  # the JSD gate accepts any draft, p(x) = 0 included
    params = {
        "threshold": ParamSpec(
            "threshold", 0.2, low=0.0, high=math.inf, grid=(0.05, 0.2, 0.3),
            doc="JSD threshold in nats; 0 never accepts (autoregressive from p)",
        )
    }
    one_hot_q = ("accept iff JSD(p, δ_x) < T, i.e. only when p is concentrated on x; "
                 "JSD(output, p) <= T per token still holds")
    at_greedy = "JSD is 0 (argmaxes agree) or ln 2: strict for 0 < T <= ln 2; T > ln 2 accepts every draft"

    def greedy_point(self, params: dict) -> dict | None:
        return None if params.get("threshold", self.params["threshold"].default) <= math.log(2) else dict(params)

    def accept_prob(self, pos: Positions, *, threshold: float) -> torch.Tensor:
        return (jsd(pos.p, pos.q) < threshold).to(pos.p.dtype)

    def residual(self, pos: Positions, **params) -> torch.Tensor:
        return pos.p

    # The JSD in float64 (the sampler's jsd): within float32 rounding of processing.jsd.
    native_test = "fuzzy.c"  # csrc/rules/fuzzy.c
    native_residual = True
