"""Speculative cascades, token-level deferral (Narasimhan et al., colab Token-v3, Eq. 15).

A = {v : p̃(v) >= (1-α)·max p̃}, p̃ the verifier at temperature 1 without
top-k / top-p; π(v) = q(v)·1[v∈A] + η·p(v) with η = Σ_{v∉A} q(v) (so π sums
to 1). Accept min(1, π(x)/q(x)); residual (π - q)+. No α is strict (α = 0
keeps only the argmax in A; α = 1 gives π = q).
"""

import torch

from relaxspec.acceptance.base import ParamSpec, Positions, Rule, register
from relaxspec.acceptance.processing import at_tokens, capped_ratio


def top_set(pos: Positions, alpha: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(1[v∈A] [..., V], η = Σ_{v∉A} q(v) [..., 1], (1-α)·max p̃ [..., 1]: A = {v : p̃(v) >= this}), once per
    block (`Positions.shared`). q zeroed on A has the same values, and so the same sum, as q·1[v∉A]."""
    def compute(pos: Positions):
        floor = (1.0 - alpha) * pos.p_tilde.amax(dim=-1, keepdim=True)
        in_a = pos.p_tilde >= floor
        return in_a, pos.q.masked_fill(in_a, 0.0).sum(dim=-1, keepdim=True), floor
    return pos.shared(("spec-casc-tok", alpha), compute)


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

    def greedy_point(self, params: dict) -> dict | None:  # alpha = 0: A holds the argmax alone
        return None if params.get("alpha", self.params["alpha"].default) == 0 else dict(params)

    def accept_prob(self, pos: Positions, *, alpha: float) -> torch.Tensor:
        # π(x) = q(x)·1[x∈A] + η·p(x): the same float operations as π's column x (residual).
        _, eta, floor = top_set(pos, alpha)
        in_a_x = at_tokens(pos.p_tilde, pos.x) >= floor.squeeze(-1)
        return capped_ratio(pos.q_x * in_a_x + eta.squeeze(-1) * pos.p_x, pos.q_x)

    def residual(self, pos: Positions, *, alpha: float) -> torch.Tensor:
        in_a, eta, _ = top_set(pos, alpha)
        return (pos.q * in_a + eta * pos.p).sub_(pos.q).clamp_min_(0.0)

    # A in logit space: p~(v) >= (1-α) max p~ iff z(v) - max z >= log(1-α) (exp is increasing; -inf at α = 1: every
    # token), no softmax: a token within rounding of the edge of A may be placed apart from torch's softmax; then the
    # same float32 operations as above, η summed in float64.
    native_test = "spec_casc_tok.c"  # csrc/rules/spec_casc_tok.c
    native_residual = True
