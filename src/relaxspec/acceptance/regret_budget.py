"""A per-request regret budget (Approximate Speculative Decoding, ASD: arXiv 2608.03447; LightLLM issue #1552 and
PR #1555, transformers issue #48636).

The regret of draft x at a position is r = max_v z_p(v) - z_p(x), on the verifier's raw logits (before
temperature): 0 for its top-1 token. Each draft first gets the strict test (at temperature 0: argmax matching).
A draft the strict test rejects is kept anyway while all of these hold:

* the request's budget: the regret it has spent (over its earlier rounds and the drafts kept so far in this block)
  plus r is at most `budget` (B);
* the local gate: r <= `local_ratio` * (K - i), K the drafts the row proposes this round and i = 0..K-1 the
  position (ASD's suffix-value weighting: later drafts get less slack);
* the cap: the request has kept fewer than `max_mismatches` such drafts so far;
* the draft is possible: p(x) > 0 when sampling; a finite z_p(x) at temperature 0.

Each kept mismatch spends its r and one from the cap. What a request has spent is a per-sequence `state`
(`regret_spent`, `mismatches_taken`) that the engine carries from round to round and reports per sequence
(`GenerationStats.rule_state`); a direct `verify` call starts from 0 unless given it, and returns it updated in
`VerifyResult.state`. Residual (p - q)+ (at temperature 0 the verifier's argmax), bonus p.

ASD is defined for greedy verification. When sampling (our extension) the strict test runs first with its uniform
and only a draft it rejects is charged: the budget's branch is tried in position order with the block's acceptance
uniforms (`reads_uniforms`), so each row's charges are what its own draws decide. So the rule never accepts less
often than strict, and B = 0 or a cap of 0 is exactly strict (also where a draft ties the top-1 logit without being
the argmax: the references count such a draft as a match, and this rule as a mismatch of regret 0).

Deviation from the references: their cap counts mismatches per draft block; the cap here is per request, as the
budget is.
"""

import math

import torch

from relaxspec.acceptance.base import ParamSpec, Positions, Rule, StateSpec, register
from relaxspec.acceptance.processing import at_tokens, capped_ratio, is_greedy, strict_kept


def _regret(pos: Positions) -> torch.Tensor:
    """[B, N]: max z_p - z_p(x) at each draft (+inf where z_p(x) is -inf), computed once per block."""
    return pos.shared("regret-budget regret", lambda at: at.z_p.amax(dim=-1) - at_tokens(at.z_p, at.x))


def _spend(spent: torch.Tensor, taken: torch.Tensor, regret: torch.Tensor, relaxed: torch.Tensor):
    """(spent, taken) [B] after charging, in position order, each draft where relaxed [B, N] holds its regret and
    one mismatch (the same additions as the test's, so the state and the test agree to the bit)."""
    for i in range(regret.shape[-1]):
        spent = spent + torch.where(relaxed[:, i], regret[:, i], 0.0)
        taken = taken + relaxed[:, i].to(taken.dtype)
    return spent, taken


@register
class RegretBudgetRule(Rule):
    name = "regret-budget"
    description = ("ASD: strict test; a rejected draft is kept while the request's cumulative logit regret stays "
                   "within a budget, under a per-position gate and a cap on mismatches.")
    accepts_at_least_strict = True  # the budget only keeps drafts the strict test rejected
    reads_uniforms = True
    one_hot_q = "the strict test becomes min(1, p(x)); the budget's branch does not read q"
    relaxes_at_greedy = True
    at_greedy = ("a mismatch is kept while the request's regret max z_p - z_p(x) stays within the budget, under the "
                 "local gate and the cap (ASD)")
    params = {
        "budget": ParamSpec(
            "budget", 2.0, low=0.0, high=math.inf, strict_value=0.0, grid=(0.5, 2.0, 8.0),
            doc="B: the regret (raw-logit gap to the top-1) a request may spend on kept mismatches; 0 is strict",
        ),
        "local_ratio": ParamSpec(
            "local_ratio", 1.0, low=0.0, high=math.inf,
            doc="g: one draft's regret must be <= g * (K - i), K the row's drafts, i its position (ASD's gate)",
        ),
        "max_mismatches": ParamSpec(
            "max_mismatches", math.inf, low=0.0, high=math.inf, strict_value=0.0, integer=True,
            doc="the most mismatches a request may keep (inf: no cap); 0 is strict",
        ),
    }
    state = {
        "regret_spent": StateSpec("regret_spent", 0.0, 0.0, math.inf,
                                  doc="the regret the request has spent on kept mismatches, float [B] >= 0"),
        "mismatches_taken": StateSpec("mismatches_taken", 0.0, 0.0, math.inf,
                                      doc="the mismatches the request has kept, float [B] >= 0"),
    }

    def accept_prob(self, pos: Positions, *, budget: float, local_ratio: float, max_mismatches: float,
                    regret_spent: torch.Tensor, mismatches_taken: torch.Tensor) -> torch.Tensor:
        strict = capped_ratio(pos.p_x, pos.q_x)
        relaxed = self._relaxed(pos, strict, budget, local_ratio, max_mismatches, regret_spent, mismatches_taken)
        return torch.where(relaxed, 1.0, strict)

    def _relaxed(self, pos, strict, budget, local_ratio, max_mismatches, spent, taken) -> torch.Tensor:
        """bool [B, N]: where the budget's branch keeps a draft (assuming the drafts before it kept: where they are
        not, the position is never reached)."""
        if budget == 0 or max_mismatches == 0:
            return torch.zeros_like(strict, dtype=torch.bool)
        regret, N = _regret(pos), strict.shape[-1]
        suffix = pos.row_ends.unsqueeze(-1) - torch.arange(N, device=strict.device)  # K - i
        possible = torch.isfinite(regret) if is_greedy(pos.temperature) else pos.p_x > 0
        candidate = ~strict_kept(pos, strict) & possible & (regret <= local_ratio * suffix)
        spent, taken = spent.to(regret.dtype), taken.to(regret.dtype)
        relaxed = torch.zeros_like(candidate)
        for i in range(N):  # in position order: a kept mismatch spends from what the later ones may use
            relaxed[:, i] = candidate[:, i] & (spent + regret[:, i] <= budget) & (taken + 1 <= max_mismatches)
            spent, taken = _spend(spent, taken, regret[:, i:i + 1], relaxed[:, i:i + 1])
        return relaxed

    def next_state(self, pos: Positions, relaxed: torch.Tensor, *, regret_spent: torch.Tensor,
                   mismatches_taken: torch.Tensor, **params) -> dict[str, torch.Tensor]:
        regret = _regret(pos)
        spent, taken = _spend(regret_spent.to(regret.dtype), mismatches_taken.to(regret.dtype), regret, relaxed)
        return {"regret_spent": spent, "mismatches_taken": taken}
