"""TensorRT-LLM's relaxed acceptance for MTP (`relaxed_topk`, `relaxed_delta`; `mtpRelaxedAcceptanceKernel`).

Candidates: the `topk` most probable tokens of the verifier whose probability is at least p(top-1) - delta (the
top-1 always is one). A draft that is a candidate is accepted; the emitted token after the last accepted draft
is the top-1. TensorRT-LLM runs it on greedy requests only, ranking softmax(logits); so does this rule at
temperature 0 (the untempered softmax(z_p); the residual and bonus of the one-hot p are its argmax).

When sampling (our extension; TensorRT-LLM has no sampling path for it) the candidates come from the processed p
(tokens with p = 0 never are), a candidate is accepted with probability 1 and any other draft gets the strict test
min(1, p(x)/q(x)); residual (p - q)+, bonus p. So it never accepts less than strict, and topk = 0 (no
candidate) is exactly strict. TensorRT-LLM's defaults are topk 1, delta 0 (argmax only); DeepSeek-R1's
recommended setting, and Modular MAX's defaults, are topk 10, delta 0.6.
"""

import math

import torch

from relaxspec.acceptance.base import ParamSpec, Positions, Rule, register
from relaxspec.acceptance.processing import accept_or_strict, ranking_probs, top_candidate


@register
class TopkDeltaRule(Rule):
    name = "topk-delta"
    description = ("TensorRT-LLM relaxed MTP acceptance: accept a draft among the top-k of p with "
                   "p(x) >= p(top-1) - delta, else the strict test.")
    accepts_at_least_strict = True  # candidates accepted outright, the others get the strict test
    one_hot_q = "candidates accepted, any other draft with probability p(x)"
    relaxes_at_greedy = True
    at_greedy = "a draft among the top-k of softmax(z_p) within delta of the top-1 is accepted (TensorRT-LLM's rule)"
    params = {
        "topk": ParamSpec(
            "topk", 10.0, low=0.0, high=math.inf, high_inclusive=False, strict_value=0.0, integer=True,
            doc="candidates: at most this many of the most probable tokens (TensorRT-LLM relaxed_topk); 0 is strict",
        ),
        "delta": ParamSpec(
            "delta", 0.6, low=0.0, high=1.0, grid=(0.3, 0.6),
            doc="candidates: p(x) >= p(top-1) - delta (TensorRT-LLM relaxed_delta, a probability)",
        ),
    }

    def accept_prob(self, pos: Positions, *, topk: float, delta: float) -> torch.Tensor:
        probs, probs_x = ranking_probs(pos)
        candidate = top_candidate(probs, probs_x, topk, lambda top1: top1 - delta)
        return accept_or_strict(candidate, pos.p_x, pos.q_x)

    # When sampling (the processed p ranks): the sampler's top_candidate_test, floor p(top-1) - delta.
    native_test = "topk_delta.c"  # csrc/rules/topk_delta.c
