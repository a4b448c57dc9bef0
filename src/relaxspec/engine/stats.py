"""Speculative-decoding statistics in vLLM's vocabulary (mean acceptance length includes the bonus)."""

from __future__ import annotations


class SequenceStats:
    def __init__(self, draft_length: int):
        self.draft_length = draft_length  # 0 for autoregressive decoding
        self.rounds = 0
        self.accepted = 0
        self.accepted_per_position = [0] * draft_length

    def add_round(self, num_accepted: int) -> None:
        self.rounds += 1
        self.accepted += num_accepted
        for i in range(num_accepted):
            self.accepted_per_position[i] += 1

    def as_dict(self) -> dict:
        return _summary(self.rounds, self.accepted, self.accepted_per_position, self.draft_length)


def _summary(rounds: int, accepted: int, per_position: list[int], draft_length: int) -> dict:
    proposed = rounds * draft_length
    return {
        "drafts_proposed": proposed,
        "drafts_accepted": accepted,
        "acceptance_rate": accepted / proposed if proposed else 0.0,
        "acceptance_rate_per_position": [a / rounds if rounds else 0.0 for a in per_position],
        # tokens per verifier call: accepted drafts + the one residual/bonus token (1.0 for AR)
        "mean_acceptance_length": (rounds + accepted) / rounds if rounds else 0.0,
        "verifier_calls": rounds,
        "drafter_calls": rounds * draft_length,
    }


def aggregate(stats: list[SequenceStats], draft_length: int) -> dict:
    per_position = [sum(s.accepted_per_position[i] for s in stats) for i in range(draft_length)]
    return _summary(sum(s.rounds for s in stats), sum(s.accepted for s in stats), per_position, draft_length)
