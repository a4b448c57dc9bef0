"""SGLang's acceptance thresholds (`--speculative-accept-threshold-single`, `--speculative-accept-threshold-acc`;
sgl-kernel `TreeSpeculativeSamplingTargetOnly`, on a chain: one uniform u per draft position).

"Target only": the draft is treated as one-hot, q is never read. Accept x iff u <= p(x)/acc (p(x) > 0) or
p(x) >= single; at the first rejection sample p with x removed (the kernel sets the rejected token's draft
probability to its target probability and samples relu(p - draft_probs)); bonus p.

SGLang's ranges and meanings: single and acc in [0, 1]; acc is floored at 1e-9 (the kernel's launcher takes
fmaxf(acc, 1e-9f)), so acc = 0 accepts every draft with p(x) >= 1e-9 and tests the rest against p(x) * 1e9;
single = 0 accepts every draft, whatever p(x) (p(x) >= 0 always holds: the always-accept baseline, as
ensemble's weight = 0; off the rule's grid, which keeps `trusts_q` False there).

The tie: the kernel accepts at coin == p(x)/acc (`coin <= prob_acc / threshold_acc`), and so does this rule. The
shared loop accepts iff u < accept_prob, so accept_prob is the float just above p(x)/acc (nextafter toward 2):
for uniforms in accept_prob's dtype, or on a coarser grid (the 24-bit ones the loop draws), u < it exactly when
u <= p(x)/acc. One difference is kept on purpose: a draft the verifier rules out (p(x) = 0) is never accepted
by the ratio test (accept_prob 0), where the kernel's coin <= 0 accepts it when its coin is exactly 0 (2^-24 per
draft with torch.rand's float32 coins); so a temperature-0 block (p one-hot) is exactly strict for every
single > 0.

single = acc = 1 (SGLang's defaults) is lossless: accepting x with probability p(x) and otherwise sampling p
without x emits p whatever the drafter proposed (up to the tie's one uniform step, 2^-24). It is not strict
speculative sampling, though (strict accepts min(1, p(x)/q(x)), which is more): the two agree token for token
only when q is one-hot, but at u == p(x) (strict rejects there). So the rule declares no strict setting. SGLang
sends greedy requests to exact argmax matching; on a one-hot p the test gives the same for every single > 0.
"""

import torch

from relaxspec.acceptance.base import ParamSpec, Positions, Rule, register

ACC_FLOOR = 1e-9  # the kernel's floor on acc (its launcher: fmaxf(threshold_acc, 1e-9f))


@register
class ThresholdRule(Rule):
    name = "threshold"
    description = ("SGLang thresholds (target-only): accept iff u <= p(x)/acc (p(x) > 0) or p(x) >= single; "
                   "residual p without x; lossless at single = acc = 1.")
    reads_q = False
    one_hot_q = "q is not read (the draft is treated as one-hot already): the same rule"
    at_greedy = ("p one-hot, p(x) is 0 or 1: exactly strict for every single > 0 and every acc; single = 0 accepts "
                 "every draft (SGLang: greedy never uses them)")
    params = {
        "single": ParamSpec(
            "single", 1.0, low=0.0, high=1.0, grid=(0.01, 1.0),
            doc="accept outright when p(x) >= single (SGLang speculative_accept_threshold_single; 1 is off, "
                "0 accepts every draft)",
        ),
        "acc": ParamSpec(
            "acc", 1.0, low=0.0, high=1.0,
            doc="accept when u <= p(x)/acc (SGLang speculative_accept_threshold_acc; 1 is lossless; "
                "floored at 1e-9 as SGLang does, so 0 accepts every p(x) >= 1e-9)",
        ),
    }

    def greedy_point(self, params: dict) -> dict | None:
        return None if params.get("single", self.params["single"].default) > 0 else dict(params)

    def accept_prob(self, pos: Positions, *, single: float, acc: float) -> torch.Tensor:
        p_x = pos.p_x
        ratio = p_x / max(acc, ACC_FLOOR)
        # u < nextafter(ratio) is u <= ratio (SGLang's test); 0 where p(x) = 0; 1 where p(x) >= single
        above = torch.nextafter(ratio, ratio.new_full((), 2.0)).clamp_(max=1.0)
        return above.masked_fill_(p_x <= 0, 0.0).masked_fill_(p_x >= single, 1.0)

    def residual(self, pos: Positions, **params) -> torch.Tensor:
        return pos.p.scatter(-1, pos.x.unsqueeze(-1), 0.0)

    # The same float32 operations as accept_prob and residual.
    native_test = "threshold.c"  # csrc/rules/threshold.c
    native_residual = True
