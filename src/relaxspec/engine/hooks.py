"""The speculative round's hooks, each configured once per generate call (None when off), none a flag of the loop
(how many tokens a row drafts, N, draft_length="auto" and the confidence stop, is the drafter's policy:
drafters/policy.py):

* `PhaseRelax` (phase): the rule decides inside each row's span, strict outside (the `relax` rule input);
* the pivot classifier (PAD's `pivot_fn`) is a callable already: the round gives it the block's hidden states.
"""

from __future__ import annotations

import numpy as np
import torch

from relaxspec.engine.phase import Phase, PhaseTracker


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
