"""The verify step's hooks: one small interface, `VerifyHook`, whose methods the speculative round calls at named
points; the round holds the hooks a request asks for in a list (`verify_hooks`), none a flag of the loop:

* `PivotInput` (PAD's `pivot_fn`): the rule's `pivot_prob` input, from the block's hidden states;
* `PhaseRelax` (phase): the rule decides inside each row's span, strict outside (the `relax` rule input).

How many tokens a row drafts (N, draft_length="auto", the confidence stop) is the drafter's policy
(drafters/policy.py), not a hook of the round.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch

from relaxspec.engine.phase import Phase, PhaseTracker


@dataclass(frozen=True)
class Block:
    """A round's verifier block as the hooks read it (L live rows, `width` draft columns)."""

    drafts: torch.Tensor  # [L, width]
    target_logits: torch.Tensor  # [L, width + 1, V] the verifier's
    draft_logits: torch.Tensor  # [L, width + extra, V] the drafter's
    hidden: torch.Tensor | None  # the verifier's hidden states of [last, x_1..x_width] (None: the round reads none)
    proposed: int | np.ndarray  # each row's number of drafts (an int: every row's)


class VerifyHook(Protocol):
    """What the round calls, and when (each a no-op unless a hook gives it):

    * `inputs(block)`: before verify, the rule inputs the hook gives this round (e.g. {"pivot_prob": ...});
    * `advance(rounds)`: after both rollbacks, each row's kept drafts and emitted token, read from the round's host
      copy (None unless `host_rounds`);
    * `select(rows)`: rows leave the batch (only `rows` stay);
    * `warning()`: at the end of the call, its one warning or None."""

    host_rounds: bool = False  # `advance` reads `rounds`

    def inputs(self, block: Block) -> dict:
        return {}

    def advance(self, rounds: list[list[int]] | None) -> None:
        pass

    def select(self, rows: list[int]) -> None:
        pass

    def warning(self) -> str | None:
        return None


class PivotInput(VerifyHook):
    """PAD's pivot classifier (`pivot_fn`, relaxspec.pivot): the rule's `pivot_prob` input [L, width], from the
    verifier's hidden states at the drafts and both models' logits."""

    def __init__(self, pivot_fn):
        self.pivot_fn = pivot_fn

    def inputs(self, block: Block) -> dict:
        width = block.drafts.shape[1]
        return {"pivot_prob": self.pivot_fn(block.hidden[:, 1:], block.target_logits[:, :width],
                                            block.draft_logits[:, :width], block.drafts)}


class PhaseRelax(VerifyHook):
    """phase: where each row's span lets the rule decide (verify's `relax`, strict elsewhere), from each row's
    phase state (engine.phase.PhaseTracker), which the tokens each round emits then advance; counts the drafts the
    rule decides in `stats.phase_relaxed_positions`."""

    host_rounds = True

    def __init__(self, phase: Phase, tokenizer, prompts: list[list[int]], device, stats):
        self.phase, self.device, self.stats = phase, device, stats
        self.tracker = PhaseTracker(phase, tokenizer, prompts)

    def inputs(self, block: Block) -> dict:
        """{"relax": [L, width + 1] bools} for the round's drafts; the drafts below each row's number count."""
        relax = self.tracker.relax(block.drafts.tolist())
        limits = np.broadcast_to(block.proposed, (len(relax),))
        self.stats.phase_relaxed_positions += sum(sum(flags[:n]) for flags, n in zip(relax, limits))
        return {"relax": torch.tensor(relax, device=self.device)}

    def advance(self, rounds: list[list[int]] | None) -> None:
        """Commit each row's kept drafts and emitted token to its phase state."""
        self.tracker.advance(rounds)

    def select(self, rows: list[int]) -> None:
        self.tracker.select(rows)

    def warning(self) -> str | None:
        """The call's warning when the span never opened in any response (every draft verified strictly)."""
        if self.stats.drafts_proposed and not self.stats.phase_relaxed_positions:
            return (f"phase {str(self.phase)!r}: the span never opened in any response; every draft was verified "
                    "strictly (the run is strict's)")
        return None


def verify_hooks(request, stats) -> list[VerifyHook]:
    """The hooks a checked request asks for, in the order their inputs are made: the pivot classifier, the phase."""
    hooks: list[VerifyHook] = []
    if request.pivot_fn is not None:
        hooks.append(PivotInput(request.pivot_fn))
    if request.phase is not None:
        hooks.append(PhaseRelax(request.phase, request.verifier.tokenizer, request.encoded, request.device, stats))
    return hooks
