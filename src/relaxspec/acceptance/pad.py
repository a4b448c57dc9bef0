"""Pivot-aware speculative decoding, PAD (Ziashahabi et al., NeurIPS 2025).

Accept if the strict test accepts, OR (with probability 1) if the classifier's
P(pivot) < threshold and p~(x) >= min_prob, p~ being the verifier at temperature
1 without top-k/top-p. Residual (p - q)+; bonus p.

min_prob gates only the classifier branch, never the strict test, so
threshold 0 (no P(pivot) in [0, 1] is < 0) is exactly strict, i.e. lossless.
"""

import torch

from relaxspec.acceptance.base import ParamSpec, Positions, Rule, TensorInput, register
from relaxspec.acceptance.processing import capped_ratio


@register
class PadRule(Rule):
    name = "pad"
    description = "PAD: strict test, or accept when the pivot classifier says the token is harmless."
    params = {
        "threshold": ParamSpec(
            "threshold", 0.5, low=0.0, high=1.0, strict_value=0.0, grid=(0.3, 0.5, 0.7),
            doc="accept a rejected draft when P(pivot) < threshold; 0 is strict",
        ),
        "min_prob": ParamSpec(
            "min_prob", 1e-4, low=0.0, high=1.0,
            doc="the classifier branch needs the untempered p(x) >= min_prob",
        ),
    }
    inputs = {
        "pivot_prob": TensorInput(
            "pivot_prob", 0.0, 1.0,
            doc="classifier P(pivot) per draft position: float tensor [B, N] in [0, 1]",
        )
    }

    def accept_prob(
        self, pos: Positions, *, threshold: float, min_prob: float, pivot_prob: torch.Tensor
    ) -> torch.Tensor:
        pivot_prob = pivot_prob.to(device=pos.p.device, dtype=pos.p.dtype)
        # The floor is on the untempered verifier probability (as in the PAD paper): at temperature 0
        # the processed p is one-hot, so gating on it would block every mismatched draft.
        raw_p_x = pos.p_tilde.gather(-1, pos.x.unsqueeze(-1)).squeeze(-1)
        harmless = (pivot_prob < threshold) & (raw_p_x >= min_prob)
        return torch.where(harmless, 1.0, capped_ratio(pos.p_x, pos.q_x))
