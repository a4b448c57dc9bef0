"""Pivot-aware speculative decoding, PAD (Ziashahabi et al., NeurIPS 2025 workshop).

The classifier gives P(pivot) per draft position (input `pivot_prob`). Two floor
semantics (parameter `floor`):

* `classifier` (default): accept if the strict test accepts, OR (with probability 1)
  if P(pivot) < threshold and p~(x) >= min_prob, p~ being the verifier at temperature
  1 without top-k/top-p. The floor gates only the classifier branch, never the strict
  test, so threshold 0 (no P(pivot) in [0, 1] is < 0) is exactly strict, i.e. lossless.
* `authors`: as the authors' decode.py, accepted = (strict OR non-pivotal) AND floor,
  so the floor also rejects drafts the strict test accepted. Non-pivotal iff
  P(pivot) <= threshold (pivotal iff P(pivot) > threshold). The floor reads
  softmax(z_p / T)(x) >= min_prob when sampling (their logits are divided by T in
  place before they take the softmax; no top-k/top-p), and the ratio of the untempered
  softmax(z_p)(x) / softmax(z_q)(x) >= min_prob at temperature 0.

Residual (p - q)+ (at temperature 0: the verifier's argmax); bonus p.
"""

import torch

from relaxspec.acceptance.base import ChoiceSpec, ParamSpec, Positions, Rule, TensorInput, register
from relaxspec.acceptance.processing import capped_ratio, is_greedy


def _at_draft(probs: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    return probs.gather(-1, x.unsqueeze(-1)).squeeze(-1)


@register
class PadRule(Rule):
    name = "pad"
    description = "PAD: strict test, or accept when the pivot classifier says the token is harmless."
    accepts_at_least_strict = True  # with the default floor ('classifier'), not with 'authors'
    params = {
        "threshold": ParamSpec(
            "threshold", 0.5, low=0.0, high=1.0, strict_value=0.0, grid=(0.3, 0.5, 0.7),
            doc="classifier floor: accept a rejected draft when P(pivot) < threshold (0 is strict); "
                "authors floor: non-pivotal when P(pivot) <= threshold",
        ),
        "min_prob": ParamSpec(
            "min_prob", 1e-4, low=0.0, high=1.0,
            doc="probability floor (see floor)",
        ),
        "floor": ChoiceSpec(
            "floor", "classifier", ("classifier", "authors"), strict_value="classifier",
            doc="classifier: min_prob gates only the classifier branch, on the untempered p~(x); "
                "authors: (strict or non-pivotal) and floor, on softmax(z_p/T)(x) when sampling, "
                "on p~(x)/q~(x) at temperature 0",
        ),
    }
    inputs = {
        "pivot_prob": TensorInput(
            "pivot_prob", 0.0, 1.0,
            doc="classifier P(pivot) per draft position: float tensor [B, N] in [0, 1]",
        )
    }
    one_hot_q = "the strict test becomes min(1, p(x)); the classifier branch does not read q"
    relaxes_at_greedy = True
    at_greedy = ("classifier floor: a mismatch is accepted when P(pivot) < threshold and p~(x) >= min_prob "
                 "(the PAD paper's greedy mode); authors floor: (match or P(pivot) <= threshold) and "
                 "p~(x)/q~(x) >= min_prob")

    def accept_prob(
        self, pos: Positions, *, threshold: float, min_prob: float, floor: str, pivot_prob: torch.Tensor
    ) -> torch.Tensor:
        pivot_prob = pivot_prob.to(device=pos.p.device, dtype=pos.p.dtype)
        strict = capped_ratio(pos.p_x, pos.q_x)
        raw_p_x = _at_draft(pos.p_tilde, pos.x)
        if floor == "classifier":
            # Untempered p: at temperature 0 the processed p is one-hot, and gating on it would
            # block every mismatched draft.
            harmless = (pivot_prob < threshold) & (raw_p_x >= min_prob)
            return torch.where(harmless, 1.0, strict)
        if is_greedy(pos.temperature):
            above_floor = raw_p_x / _at_draft(pos.z_q.softmax(dim=-1), pos.x) >= min_prob
        else:
            above_floor = _at_draft((pos.z_p / pos.temperature).softmax(dim=-1), pos.x) >= min_prob
        accept = torch.where(pivot_prob <= threshold, 1.0, strict)
        return torch.where(above_floor, accept, 0.0)

    # When sampling: prm = (threshold, min_prob, floor's index: 0 classifier, 1 authors, temperature); `in` is
    # pivot_prob. The floors' softmax (untempered, or at T for the authors') from the sampler's exp: within float32
    # rounding of torch's softmax, so a draft within rounding of min_prob may be judged apart.
    native_test = "pad.c"  # csrc/rules/pad.c
