"""The speculative round's hooks, each configured once per generate call (None when off), none a flag of the loop:

* `AutoDraftLength` (draft_length="auto"): each row's own draft-length limit, the book's `schedule`;
* `ConfidenceStop` (draft_confidence): a row stops drafting after a low-confidence draft, the drafter's `stop`;
* `PhaseRelax` (phase): the rule decides inside each row's span, strict outside (the `relax` rule input);
* the pivot classifier (PAD's `pivot_fn`) is a callable already: the round gives it the block's hidden states.
"""

from __future__ import annotations

import numpy as np
import torch

from relaxspec.engine.phase import Phase, PhaseTracker

AUTO_START, AUTO_MAX = 5, 10  # draft_length="auto": its first draft length and its bound (it never goes below 1)


class AutoDraftLength:
    """draft_length="auto": each sequence's own draft length, +2 after a round that accepted all the drafts it
    proposed, -1 after any other, within [1, bound] (transformers' "heuristic" num_assistant_tokens schedule)."""

    def __init__(self, batch: int, bound: int):
        self.lengths, self.bound = np.full(batch, AUTO_START, dtype=np.int64), bound

    def limit(self, rows: np.ndarray) -> np.ndarray:
        return self.lengths[rows]

    def update(self, rows: np.ndarray, accepted: np.ndarray, proposed) -> None:
        self.lengths[rows] = np.clip(self.lengths[rows] + np.where(accepted == proposed, 2, -1), 1, self.bound)


class ConfidenceStop:
    """draft_confidence: a row stops drafting after a draft to which its drafter gave a probability below
    `threshold` (under the drafter's processed q, the distribution the draft was drawn from; greedy: the
    softmax of its logits), and that draft is still proposed: transformers' `ConfidenceCriteria`
    (assistant_confidence_threshold), per row. The drafter's loop ends once every row has stopped; `count`
    is each row's number of drafts (its length limit when its stop never fired). One small copy to the host
    per draft step. One per round (the round's hook is `partial(ConfidenceStop, threshold)`)."""

    def __init__(self, threshold: float, limits: np.ndarray):
        self.threshold, self.count = threshold, limits

    def __call__(self, i: int, logits, token, probs) -> bool:
        q = torch.softmax(logits, dim=-1) if probs is None else probs
        low = (q.gather(1, token[:, None]).squeeze(1) < self.threshold).cpu().numpy()
        self.count = np.where(low & (self.count > i + 1), i + 1, self.count)
        return bool((self.count <= i + 1).all())


class PhaseRelax:
    """phase: where each row's span lets the rule decide (verify's `relax`, strict elsewhere), from each row's
    phase state (engine.phase.PhaseTracker), which the tokens each round emits then advance."""

    def __init__(self, phase: Phase, tokenizer, prompts: list[list[int]], device):
        self.phase, self.device = phase, device
        self.tracker = PhaseTracker(phase, tokenizer, prompts)

    def relax(self, drafts: torch.Tensor, limits: np.ndarray, stats) -> torch.Tensor:
        """[L, width + 1] bools for the round's drafts [L, width]; counts the drafts the rule decides (those
        below each row's limit) in stats.phase_relaxed_positions."""
        relax = self.tracker.relax(drafts.tolist())
        stats.phase_relaxed_positions += sum(sum(flags[:n]) for flags, n in zip(relax, limits))
        return torch.tensor(relax, device=self.device)

    def advance(self, rounds: list[list[int]]) -> None:
        """Commit each row's kept drafts and emitted token to its phase state."""
        self.tracker.advance(rounds)

    def select(self, rows: list[int]) -> None:
        self.tracker.select(rows)

    def never_opened(self, stats) -> str | None:
        """The call's warning when the span never opened in any response (every draft verified strictly)."""
        if stats.drafts_proposed and not stats.phase_relaxed_positions:
            return (f"phase {str(self.phase)!r}: the span never opened in any response; every draft was verified "
                    "strictly (the run is strict's)")
        return None
