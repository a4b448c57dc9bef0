"""SGLang's acceptance thresholds (`--speculative-accept-threshold-single`, `--speculative-accept-threshold-acc`;
sgl-kernel `TreeSpeculativeSamplingTargetOnly`, on a chain: one uniform u per draft position).

"Target only": the draft is treated as one-hot, q is never read. Accept x iff u <= p(x)/acc or p(x) >= single;
at the first rejection sample p with x removed (the kernel sets the rejected token's draft probability to its
target probability and samples relu(p - draft_probs)); bonus p.

single = acc = 1 (SGLang's defaults) is lossless: accepting x with probability p(x) and otherwise sampling p
without x emits exactly p whatever the drafter proposed. It is not strict speculative sampling, though (strict
accepts min(1, p(x)/q(x)), which is more): the two agree token for token only when q is one-hot (a drafter
without a distribution, and temperature 0). So the rule declares no strict setting. SGLang sends greedy
requests to exact argmax matching; on a one-hot p the test gives the same for every single, acc > 0.
"""

import torch

from relaxspec.acceptance.base import ParamSpec, Positions, Rule, register


@register
class ThresholdRule(Rule):
    name = "threshold"
    description = ("SGLang thresholds (target-only): accept iff u <= p(x)/acc or p(x) >= single; "
                   "residual p without x; lossless at single = acc = 1.")
    reads_q = False
    one_hot_q = "q is not read (the draft is treated as one-hot already): the same rule"
    at_greedy = "p one-hot, p(x) is 0 or 1: exactly strict for every single, acc > 0 (SGLang: greedy never uses them)"
    params = {
        "single": ParamSpec(
            "single", 1.0, low=0.0, high=1.0, low_inclusive=False, grid=(0.01, 1.0),
            doc="accept outright when p(x) >= single (SGLang speculative_accept_threshold_single; 1 is off)",
        ),
        "acc": ParamSpec(
            "acc", 1.0, low=0.0, high=1.0, low_inclusive=False,
            doc="accept when u <= p(x)/acc (SGLang speculative_accept_threshold_acc; 1 is lossless)",
        ),
    }

    def accept_prob(self, pos: Positions, *, single: float, acc: float) -> torch.Tensor:
        return (pos.p_x / acc).clamp_(max=1.0).masked_fill_(pos.p_x >= single, 1.0)

    def residual(self, pos: Positions, **params) -> torch.Tensor:
        return pos.p.scatter(-1, pos.x.unsqueeze(-1), 0.0)

    # The same float32 operations as accept_prob and residual.
    native_test = r"""
static inline float rule_test(const float *p, const float *q, const float *z, const float *zq, int64_t V, int64_t x,
                              const double *prm, float in) {
    (void)q; (void)z; (void)zq; (void)V;
    if (p[x] >= (float)prm[0]) return 1.0f;
    const float r = p[x] / (float)prm[1];
    return r > 1.0f ? 1.0f : r;
}
"""
    native_residual = r"""
static int rule_residual(const float *p, const float *q, const float *z, const float *zq, int64_t V, int64_t x,
                         const double *prm, float *out) {
    (void)q; (void)z; (void)zq; (void)prm;
    memcpy(out, p, V * sizeof(float));
    out[x] = 0.0f;
    return 0;
}
"""
