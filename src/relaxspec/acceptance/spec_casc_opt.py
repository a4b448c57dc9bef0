"""Speculative cascades, "opt" deferral (Narasimhan et al., ICLR 2025, colab Eq. 10).

π = q if max q >= max p - α·TV(p, q) else p, on processed probabilities.
π = q accepts unconditionally (q(x) = 0 is still rejected); π = p is the strict test
with residual (p - q)+. α is finite, as in the reference; no α is exactly strict (it
is approached as α → -inf).

Refused with a one-hot q: max q = 1 then passes the gate for every α >= 0, so
every draft is accepted, even where p(x) = 0.
"""

import math

import torch

from relaxspec.acceptance.base import ParamSpec, Positions, Rule, register
from relaxspec.acceptance.processing import accept_or_strict, total_variation


@register
class SpecCascOptRule(Rule):
    name = "spec-casc-opt"
    description = "Speculative cascade (opt): keep the draft if max q >= max p - α·TV(p,q), else strict."
    trusts_q = True  # deferring to q accepts any draft, p(x) = 0 included
    accepts_at_least_strict = True
    params = {
        "alpha": ParamSpec(
            "alpha", 0.0, low=-math.inf, high=math.inf, low_inclusive=False, high_inclusive=False,
            grid=(-0.1, 0.0, 0.05), doc="deferral slack (finite); strict as α → -inf",
        )
    }
    valid_with_one_hot_q = False
    one_hot_q = "max q = 1 passes the gate for every α >= 0: every draft is accepted, even where p(x) = 0"
    at_greedy = "max q = max p = 1, TV 0 or 1: every draft is accepted if α >= 0; strict if α < 0"

    def greedy_point(self, params: dict) -> dict | None:  # every alpha >= 0 accepts every draft: 0 stands for them
        return None if params.get("alpha", self.params["alpha"].default) < 0 else {"alpha": 0.0}

    def accept_prob(self, pos: Positions, *, alpha: float) -> torch.Tensor:
        slack = alpha * total_variation(pos.p, pos.q)
        gate = pos.q.amax(dim=-1) >= pos.p.amax(dim=-1) - slack
        return accept_or_strict(gate, pos.p_x, pos.q_x)

    # TV in float64 (the sampler's total_variation), the maxima and accept_or_strict's values as above.
    native_test = "spec_casc_opt.c"  # csrc/rules/spec_casc_opt.c
