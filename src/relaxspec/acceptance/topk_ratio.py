"""Relaxed greedy acceptance of vLLM pull request #43184 (closed; a port of #22238 and #21506, asked for again in
issue #45752): accept the draft iff it is in the top-K of the verifier and p(x) >= ratio * p(top-1).

Proposed for greedy requests in the thinking phase, ranking the verifier's probabilities; at temperature 0 this
rule ranks the untempered softmax(z_p) (the residual and bonus of the one-hot p are its argmax). When sampling
(our extension, as topk-delta): candidates from the processed p (never a token with p = 0) are accepted with
probability 1, any other draft gets the strict test; residual (p - q)+, bonus p. topk = 0 is exactly strict.
The pull request gives no default setting (it left an r x k sweep unfinished).
"""

import math

import torch

from relaxspec.acceptance.base import ParamSpec, Positions, Rule, register
from relaxspec.acceptance.processing import accept_or_strict, ranking_probs, top_candidate


@register
class TopkRatioRule(Rule):
    name = "topk-ratio"
    description = ("vLLM PR #43184 relaxed acceptance: accept a draft among the top-k of p with "
                   "p(x) >= ratio * p(top-1), else the strict test.")
    accepts_at_least_strict = True  # candidates accepted outright, the others get the strict test
    one_hot_q = "candidates accepted, any other draft with probability p(x)"
    relaxes_at_greedy = True
    at_greedy = "a draft among the top-k of softmax(z_p) with p~(x) >= ratio * p~(top-1) is accepted (the PR's rule)"
    params = {
        "topk": ParamSpec(
            "topk", 10.0, low=0.0, high=math.inf, high_inclusive=False, strict_value=0.0, integer=True,
            doc="candidates: at most this many of the most probable tokens; 0 is strict",
        ),
        "ratio": ParamSpec(
            "ratio", 0.3, low=0.0, high=1.0, grid=(0.1, 0.3),
            doc="candidates: p(x) >= ratio * p(top-1) (1: ties with the top-1 only)",
        ),
    }

    def accept_prob(self, pos: Positions, *, topk: float, ratio: float) -> torch.Tensor:
        probs, probs_x = ranking_probs(pos)
        candidate = top_candidate(probs, probs_x, topk, lambda top1: ratio * top1)
        return accept_or_strict(candidate, pos.p_x, pos.q_x)

    # When sampling (the processed p ranks): the sampler's top_candidate_test, floor ratio * p(top-1).
    native_test = "topk_ratio.c"  # csrc/rules/topk_ratio.c
