"""Typical acceptance (Medusa §3.3.1; vLLM TypicalAcceptanceSampler).

Accept iff p(x) > min(ε, δ·exp(-H(p))), H in nats of the processed p; q is not
used. At the first rejection emit argmax p; bonus p. No strict setting.
"""

import math

import torch

from relaxspec.acceptance.base import ParamSpec, Positions, Rule, register
from relaxspec.acceptance.processing import neg_entropy


@register
class TypicalRule(Rule):
    name = "typical"
    description = "Typical acceptance: accept iff p(x) > min(ε, δ·exp(-H(p))); drafter-free."
    reads_q = False
    one_hot_q = "q is not read: the same rule"
    at_greedy = "p one-hot, H(p) = 0: accept iff x is the argmax (strict) when min(ε, δ) < 1"
    params = {
        "epsilon": ParamSpec(
            "epsilon", 0.09, low=0.0, high=1.0, grid=(0.09,), doc="hard probability threshold",
        ),
        "delta": ParamSpec(
            "delta", 0.3, low=0.0, high=math.inf, high_inclusive=False, grid=(0.3,), doc="entropy-scaled threshold factor",
        ),
    }

    def accept_prob(self, pos: Positions, *, epsilon: float, delta: float) -> torch.Tensor:
        threshold = (delta * neg_entropy(pos.p).exp_()).clamp_(max=epsilon)  # exp(-H(p)), H negated once, not twice
        return (pos.p_x > threshold).to(pos.p.dtype)

    residual = Rule.residual_argmax  # argmax p at the first rejection

    # Σ p log p in float64 (the sampler's neg_entropy): within float32 rounding of torch's neg_entropy (sums in another
    # order), so a draft exactly at the threshold may be judged apart.
    native_test = "typical.c"  # csrc/rules/typical.c
