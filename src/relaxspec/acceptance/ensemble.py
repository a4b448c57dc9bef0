"""Static ensemble verification: target F = w·p + (1-w)·q.

accept min(1, (1-w) + w·p(x)/q(x)); residual (F - q)+ ∝ (p - q)+ (the default,
independent of w); bonus p. The output law is exactly F. w = 1 is strict,
w = 0 always accepts (every draft, as the reference's baseline). A draft with q(x) = 0 is
rejected for w > 0.

Refused with a one-hot q: the output law becomes w·p + (1-w)·δ_x, i.e. the drafted
token unchecked with probability 1-w, even where p(x) = 0.
"""

import torch

from relaxspec.acceptance.base import ParamSpec, Positions, Rule, register
from relaxspec.acceptance.processing import capped_ratio


@register
class EnsembleRule(Rule):
    name = "ensemble"
    description = "Static ensemble: output law w·p + (1-w)·q; accept min(1, (1-w) + w·p(x)/q(x))."
    trusts_q = True  # the draft is kept with probability 1-w whatever p(x)
    accepts_at_least_strict = True
    params = {
        "weight": ParamSpec(
            "weight", 0.9, low=0.0, high=1.0, strict_value=1.0, grid=(0.0, 0.8, 0.9, 0.95),
            doc="verifier weight w; 1 is strict, 0 always accepts (the always-accept baseline)",
        )
    }
    valid_with_one_hot_q = False
    one_hot_q = ("the output law is w·p + (1-w)·δ_x: the draft is kept unchecked with probability 1-w, "
                 "even where p(x) = 0")
    relaxes_at_greedy = True
    at_greedy = "a draft that is not the verifier's argmax is kept with probability 1-w"
    draws_at_greedy = True

    def accept_prob(self, pos: Positions, *, weight: float) -> torch.Tensor:
        if weight == 0:
            return torch.ones_like(pos.p_x)
        # (1-w) + w·min(1, r) equals min(1, (1-w) + w·r) and never meets 0·inf.
        accept = (1.0 - weight) + weight * capped_ratio(pos.p_x, pos.q_x)
        return accept.masked_fill_(pos.q_x <= 0, 0.0)

    # The same float32 operations as accept_prob.
    native_test = "ensemble.c"  # csrc/rules/ensemble.c
