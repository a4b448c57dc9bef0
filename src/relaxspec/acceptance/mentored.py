"""Mentored decoding, fixed-α / β = 1 form (Tran-Thien 2023; Leviathan App. A.5 "lenience").

accept min(1, p(x)/((1-α)·q(x))); residual (p - q)+ (the default); bonus p.
α = 0 is strict.
"""

import torch

from relaxspec.acceptance.base import ParamSpec, Positions, Rule, register
from relaxspec.acceptance.processing import capped_ratio


@register
class MentoredRule(Rule):
    name = "mentored"
    description = "Mentored decoding: accept min(1, p(x)/((1-α)q(x))), residual (p-q)+."
    accepts_at_least_strict = True  # p / ((1-α) q) >= p / q
    params = {
        "alpha": ParamSpec(
            "alpha", 0.7, low=0.0, high=1.0, high_inclusive=False, strict_value=0.0,
            grid=(0.3, 0.7, 0.95), doc="lenience; 0 is strict",
        )
    }
    one_hot_q = "accept min(1, p(x)/(1-α)), else sample p without x"
    at_greedy = "p(x) is 0 or 1: exactly strict"

    def accept_prob(self, pos: Positions, *, alpha: float) -> torch.Tensor:
        return capped_ratio(pos.p_x, (1.0 - alpha) * pos.q_x)

    native_test = "mentored.c"  # csrc/rules/mentored.c
