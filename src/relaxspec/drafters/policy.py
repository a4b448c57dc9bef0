"""A drafter's drafting policy for one generate call: how many tokens each row proposes. The policy belongs to the
drafter, not to the decoding loop (as transformers' candidate generator keeps `num_assistant_tokens` and
`assistant_confidence_threshold`):

* N: every row drafts N, fewer near the length limit (its room, which the engine's book gives);
* draft_length="auto" (`AutoDraftLength`): each row's own number, 5 at first, +2 after a round that accepted all it
  proposed, -1 after any other, within [1, N] (transformers' "heuristic" schedule);
* draft_confidence (`ConfidenceStop`): a row stops after a draft its drafter gave a probability below a threshold.

`Drafting` is a drafter with its policy, as the speculative round drives it: each row's number of drafts
(`lengths`), the drafts (`propose`, which says how many each row drafted when a stop cut them), then the round's
outcome (`rollback`, which the schedule reads). The drafter itself keeps its protocol (drafters/base.py).
"""

from __future__ import annotations

import numpy as np
import torch

from relaxspec.drafters.base import Drafter, Proposal

AUTO_START, AUTO_MAX = 5, 10  # draft_length="auto": its first draft length and its bound (it never goes below 1)


def block_width(lengths: int | np.ndarray) -> int:
    """The width of a round's block for rows drafting `lengths` (an int: every row that many; at least 1)."""
    return lengths if not isinstance(lengths, np.ndarray) else max(1, int(lengths.max()))


class AutoDraftLength:
    """draft_length="auto": each live row's own draft length, +2 after a round that accepted all the drafts it
    proposed, -1 after any other, within [1, bound] (transformers' "heuristic" num_assistant_tokens schedule)."""

    def __init__(self, batch: int, bound: int):
        self.lengths, self.bound = np.full(batch, AUTO_START, dtype=np.int64), bound

    def limit(self, room: int | np.ndarray) -> np.ndarray:
        return np.minimum(room, self.lengths)

    def update(self, accepted: np.ndarray, proposed: int | np.ndarray) -> None:
        self.lengths = np.clip(self.lengths + np.where(accepted == proposed, 2, -1), 1, self.bound)

    def select(self, rows: list[int]) -> None:
        self.lengths = self.lengths[rows]


class ConfidenceStop:
    """draft_confidence: a row stops drafting after a draft to which its drafter gave a probability below
    `threshold` (under the drafter's processed q, the distribution the draft was drawn from; greedy: the
    softmax of its logits), and that draft is still proposed: transformers' `ConfidenceCriteria`
    (assistant_confidence_threshold), per row. The drafter's loop ends once every row has stopped; `count`
    is each row's number of drafts (its length limit when its stop never fired). One small copy to the host
    per draft step. One per round: the drafter's `stop`."""

    def __init__(self, threshold: float, limits: np.ndarray):
        self.threshold, self.count = threshold, limits

    def __call__(self, i: int, logits, token, probs) -> bool:
        q = torch.softmax(logits, dim=-1) if probs is None else probs
        low = (q.gather(1, token[:, None]).squeeze(1) < self.threshold).cpu().numpy()
        self.count = np.where(low & (self.count > i + 1), i + 1, self.count)
        return bool((self.count <= i + 1).all())


class Drafting:
    """A drafter with its drafting policy for one generate call (see the module doc): `batch` rows, at most `bound`
    drafts a round; `auto`: draft_length="auto"; `confidence`: draft_confidence's threshold (None: off)."""

    def __init__(self, drafter: Drafter, batch: int, bound: int, auto: bool = False, confidence: float | None = None):
        self.drafter, self.confidence = drafter, confidence
        self.schedule = AutoDraftLength(batch, bound) if auto else None
        self.proposed: int | np.ndarray = 0  # each row's drafts of the last proposal (an int: every row's)

    def prefill(self, ids: torch.Tensor, mask: torch.Tensor, hidden: torch.Tensor | None = None) -> None:
        self.drafter.prefill(ids, mask, hidden)

    def lengths(self, room: int | np.ndarray) -> int | np.ndarray:
        """Each live row's number of drafts this round (an int: every row's), at most its `room`."""
        return room if self.schedule is None else self.schedule.limit(room)

    def propose(self, last: torch.Tensor, lengths: int | np.ndarray, extra: int, sample) -> Proposal:
        """Each row's drafts, up to its `lengths` (`extra`, `sample`: the drafter protocol's); with a confidence stop
        the proposal's `lengths` says how many each row drafted."""
        n = block_width(lengths)
        if self.confidence is None:
            self.proposed = lengths
            return self.drafter.propose(last, n, extra, sample)
        stop = ConfidenceStop(self.confidence, np.broadcast_to(lengths, (last.shape[0],)).copy())
        proposal = self.drafter.propose(last, n, extra, sample, stop=stop)
        proposal.lengths = self.proposed = stop.count
        return proposal

    def rollback(self, accepted: torch.Tensor, hidden: torch.Tensor | None, kept: np.ndarray,
                 rounds: list[list[int]] | None = None) -> None:
        """The round's outcome: accepted [L] (on the device), `kept` the same counts on the host (the engine's one copy
        of the round), `rounds` each row's kept drafts and emitted token (for a drafter with `host_rounds`)."""
        if self.schedule is not None:
            self.schedule.update(kept, self.proposed)
        self.drafter.rollback(accepted, hidden, longest=int(kept.max()),
                              rounds=rounds if self.drafter.host_rounds else None)

    def select(self, keep: torch.Tensor, rows: list[int]) -> None:
        """Keep only rows `rows` (`keep`: the same on the device)."""
        self.drafter.select(keep)
        if self.schedule is not None:
            self.schedule.select(rows)
