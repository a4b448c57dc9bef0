"""Speculative cascades, token-level deferral (Narasimhan et al., colab Token-v3, Eq. 15).

A = {v : p̃(v) >= (1-α)·max p̃}, p̃ the verifier at temperature 1 without
top-k / top-p; π(v) = q(v)·1[v∈A] + η·p(v) with η = Σ_{v∉A} q(v) (so π sums
to 1). Accept min(1, π(x)/q(x)); residual (π - q)+. No α is strict (α = 0
keeps only the argmax in A; α = 1 gives π = q).
"""

import torch

from relaxspec.acceptance.base import ParamSpec, Positions, Rule, register
from relaxspec.acceptance.processing import capped_ratio


def casc_tok_target(pos: Positions, alpha: float) -> torch.Tensor:
    p_tilde = pos.p_tilde
    in_a = p_tilde >= (1.0 - alpha) * p_tilde.amax(dim=-1, keepdim=True)
    eta = (pos.q * ~in_a).sum(dim=-1, keepdim=True)
    return pos.q * in_a + eta * pos.p


@register
class SpecCascTokRule(Rule):
    name = "spec-casc-tok"
    description = "Speculative cascade (token): π = q on the verifier's top set A, η·p elsewhere."
    params = {
        "alpha": ParamSpec(
            "alpha", 0.35, low=0.0, high=1.0, strict_value=None, grid=(0.0, 0.35, 0.8),
            doc="top-set width: A = {v: p̃(v) >= (1-α) max p̃}; no strict setting",
        )
    }
    one_hot_q = "π = δ_x if x is in the verifier's top set A, else p: accept x in A, else min(1, p(x))"
    at_greedy = "the drafter's argmax is accepted iff it is in A (from the untempered p̃), else strict"

    def accept_prob(self, pos: Positions, *, alpha: float) -> torch.Tensor:
        pi = casc_tok_target(pos, alpha)
        return capped_ratio(pi.gather(-1, pos.x.unsqueeze(-1)).squeeze(-1), pos.q_x)

    def residual(self, pos: Positions, *, alpha: float) -> torch.Tensor:
        return (casc_tok_target(pos, alpha) - pos.q).clamp_min(0.0)
