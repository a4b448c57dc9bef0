"""Speculative cascades, token-level deferral (Narasimhan et al., colab Token-v3, Eq. 15).

A = {v : p̃(v) >= (1-α)·max p̃}, p̃ the verifier at temperature 1 without
top-k / top-p; π(v) = q(v)·1[v∈A] + η·p(v) with η = Σ_{v∉A} q(v) (so π sums
to 1). Accept min(1, π(x)/q(x)); residual (π - q)+. No α is strict (α = 0
keeps only the argmax in A; α = 1 gives π = q).
"""

import torch

from relaxspec.acceptance.base import ParamSpec, Positions, Rule, register
from relaxspec.acceptance.processing import at_tokens, capped_ratio


def top_set_floor(pos: Positions, alpha: float) -> torch.Tensor:
    """[..., 1] (1-α)·max p̃: A = {v : p̃(v) >= this}."""
    return (1.0 - alpha) * pos.p_tilde.amax(dim=-1, keepdim=True)


def deferred_mass(q: torch.Tensor, in_a: torch.Tensor, keepdim: bool = False) -> torch.Tensor:
    """η = Σ_{v∉A} q(v) (q zeroed on A: the same values, and so the same sum, as q·1[v∉A])."""
    return q.masked_fill(in_a, 0.0).sum(dim=-1, keepdim=keepdim)


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
        # π(x) = q(x)·1[x∈A] + η·p(x): the same float operations as π's column x (residual).
        floor = top_set_floor(pos, alpha)
        in_a_x = at_tokens(pos.p_tilde, pos.x) >= floor.squeeze(-1)
        pi_x = pos.q_x * in_a_x + deferred_mass(pos.q, pos.p_tilde >= floor) * pos.p_x
        return capped_ratio(pi_x, pos.q_x)

    def residual(self, pos: Positions, *, alpha: float) -> torch.Tensor:
        in_a = pos.p_tilde >= top_set_floor(pos, alpha)
        pi = pos.q * in_a + deferred_mass(pos.q, in_a, keepdim=True) * pos.p
        return pi.sub_(pos.q).clamp_min_(0.0)
