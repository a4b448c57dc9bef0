"""Strict speculative sampling (Leviathan et al. 2023; Chen et al. 2023): lossless.

accept min(1, p(x)/q(x)); residual norm((p - q)+); bonus p. These are the
`Rule` defaults, so the class only names itself.
"""

from relaxspec.acceptance.base import Rule, register


@register
class StrictRule(Rule):
    name = "strict"
    description = "Lossless speculative sampling: accept min(1, p(x)/q(x)), residual (p-q)+, bonus p."
    accepts_at_least_strict = True
    greedy_closed_form = True
    at_greedy = "argmax matching, in closed form (vLLM's greedy path)"
