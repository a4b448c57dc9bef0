"""FLy, entropy-gated deferred verification (Training-Free Loosely Speculative Decoding, arXiv 2511.22972; as vLLM
ships it: docs/features/speculative_decoding/fly.md, vllm/v1/spec_decode/fly.py, PRs #50808 and #53987).

Each draft first gets the strict test, min(1, p(x)/q(x)) against its acceptance uniform. A draft the strict test
rejects at position i is kept anyway (its rejection deferred) when all of these hold:

* the verifier is unsure there: the entropy of its `fly_entropy_top_k` largest probabilities,
  -sum over those p of p log p (nats, not renormalised; vLLM's top-k entropy), is at least `fly_entropy_threshold`
  (vLLM compares with >=);
* the whole window fits: i + W < the drafts the row proposes (W = `fly_window_size`). At the end of a block, with
  fewer than W drafts after i, the rejection stands (vLLM's `pos + W < num_draft_tokens`);
* the next W drafts agree with the verifier: the strict test keeps each of them, with its own uniform (vLLM's
  random path: the native p/q acceptance of the later positions; at temperature 0, where the strict test is argmax
  matching, each later draft is the verifier's argmax: vLLM's greedy path);
* the draft is possible for both models: p(x) > 0 and q(x) > 0 when sampling; at temperature 0 a finite verifier
  logit and q(x) > 0 (vLLM's greedy path reads draft_logit > -inf).

The window's decisions are the strict ones (a deferral never rests on another deferral), as in vLLM's pre-pass.
The entropy reads the processed p when sampling (vLLM ModelRunnerV1: after temperature, top-k and top-p) and the
untempered softmax(z_p) at temperature 0 (vLLM computes it from the greedy request's logits). Residual (p - q)+
(at temperature 0 the verifier's argmax), bonus p.

W = 0 is vLLM's "off" (no window, no entropy): exactly strict. vLLM requires W < num_speculative_tokens and
defaults to min(6, N - 1), the threshold to 0.3 and the top-k to 3; here W is a parameter of its own (a W no block
fits is strict), and the paper grid varies the threshold at W = 2, which fits the bench's N = 3 and 5.

Its test reads other positions' strict outcomes, so it declares `reads_uniforms`: the loop draws the acceptance
uniforms before the test. No C kernel: the torch test serves every block, the loop's bookkeeping still in C.
"""

import math

import torch

from relaxspec.acceptance.base import ParamSpec, Positions, Rule, register
from relaxspec.acceptance.processing import capped_ratio, is_greedy, strict_kept


def top_k_entropy(log_probs: torch.Tensor, k: int) -> torch.Tensor:
    """[...]: -sum p log p over the k largest probabilities of each row of log_probs [..., V] (k capped at V;
    zero probabilities add nothing)."""
    top = log_probs.topk(min(k, log_probs.shape[-1]), dim=-1).values
    probs = top.exp()
    return -torch.where(probs > 0, probs * top, 0.0).sum(dim=-1)


@register
class FlyRule(Rule):
    name = "fly"
    description = ("FLy (vLLM): strict test; a rejection at a high-entropy position is deferred when the next "
                   "W drafts pass the strict test.")
    accepts_at_least_strict = True  # a deferral only keeps a draft the strict test rejected
    reads_uniforms = True
    one_hot_q = "the strict test becomes min(1, p(x)); the window reads those outcomes"
    relaxes_at_greedy = True
    at_greedy = ("a mismatch where softmax(z_p)'s top-k entropy is >= the threshold is kept when the next W drafts "
                 "are the verifier's argmax (vLLM's greedy FLy)")
    params = {
        "fly_window_size": ParamSpec(
            "fly_window_size", 2.0, low=0.0, high=math.inf, high_inclusive=False, strict_value=0.0, integer=True,
            doc="W: the later drafts that must pass the strict test for a rejection to be deferred (vLLM "
                "fly_window_size); 0 is strict (vLLM: FLy off)",
        ),
        "fly_entropy_threshold": ParamSpec(
            "fly_entropy_threshold", 0.3, low=0.0, high=math.inf, grid=(0.1, 0.3, 0.6),
            doc="defer only where the verifier's top-k entropy (nats) is >= this (vLLM fly_entropy_threshold)",
        ),
        "fly_entropy_top_k": ParamSpec(
            "fly_entropy_top_k", 3.0, low=1.0, high=math.inf, high_inclusive=False, integer=True,
            doc="the entropy reads the verifier's this many largest probabilities, capped at V "
                "(vLLM fly_entropy_top_k)",
        ),
    }

    def accept_prob(self, pos: Positions, *, fly_window_size: float, fly_entropy_threshold: float,
                    fly_entropy_top_k: float) -> torch.Tensor:
        strict = capped_ratio(pos.p_x, pos.q_x)
        window, N = int(fly_window_size), strict.shape[-1]
        if window == 0 or window >= N:  # no window fits in the block
            return strict
        # The next W drafts pass the strict test: a window of the strict outcomes, padded past the block (never read
        # where the window must fit in the row's drafts).
        kept = torch.nn.functional.pad(strict_kept(pos, strict), (0, window), value=False)
        agree = kept.unfold(1, window, 1)[:, 1:N + 1].all(dim=-1)
        columns = torch.arange(N, device=strict.device)
        fits = columns + window < pos.row_ends.unsqueeze(-1)
        if is_greedy(pos.temperature):
            entropy = top_k_entropy(pos.z_p.log_softmax(dim=-1), int(fly_entropy_top_k))
            possible = torch.isfinite(pos.z_p.gather(-1, pos.x.unsqueeze(-1)).squeeze(-1)) & (pos.q_x > 0)
        else:
            entropy = top_k_entropy(pos.p.log(), int(fly_entropy_top_k))
            possible = (pos.p_x > 0) & (pos.q_x > 0)
        defer = (entropy >= fly_entropy_threshold) & fits & agree & possible
        return torch.where(defer, 1.0, strict)
