"""Speculative-decoding statistics in vLLM's vocabulary, as one typed object.

Two kinds of count are kept apart:
* per-sequence verify steps, `sequence_rounds` (a sequence's round is one verify of its block;
  AR: one per token), from which the mean acceptance length tau comes;
* batched forward calls, `verifier_forwards` / `drafter_forwards` (one call serves every live
  row), which is what wall time pays for.
Mean acceptance length tau is exact: the tokens the rounds emitted (the residual / bonus token and an
ending EOS included) over the rounds, so 1.0 for autoregressive decoding; a draft that verify kept but
that EOS or the length limit then cut off is not counted as accepted (`drafts_cut` counts those).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields


BATCH_ONLY = ("verifier_forwards", "drafter_forwards", "time_draft_s", "time_verify_s", "time_total_s",
              "phase_relaxed_positions")


@dataclass
class GenerationStats:
    draft_length: int = 0  # N (0 for autoregressive decoding)
    sequences: int = 0
    sequence_rounds: int = 0  # verify steps summed over sequences
    drafts_proposed: int = 0  # N per round, fewer in a last round with less room left
    drafts_accepted: int = 0  # accepted drafts that reached the output
    drafts_cut: int = 0  # drafts verify kept that an earlier EOS (or the length limit) cut off
    proposed_per_position: list[int] = field(default_factory=list)
    accepted_per_position: list[int] = field(default_factory=list)
    generated_tokens: int = 0  # output tokens (an ending EOS is not part of the output)
    emitted_tokens: int = 0  # tokens the rounds emitted: generated_tokens plus an ending EOS per sequence
    verifier_forwards: int = 0  # batched verifier forward calls
    drafter_forwards: int = 0  # batched drafter forward calls (extra bonus-position passes included)
    # with a phase (generate(phase=...)): draft positions the rule decided, inside the span (strict decided the rest
    # of drafts_proposed); 0 with a phase: the span never opened, the run was strict
    phase_relaxed_positions: int = 0
    # a rule's per-sequence state at the end (`Rule.state`, e.g. regret-budget's regret_spent and mismatches_taken):
    # name -> one value per sequence, in prompt order (a result's stats: its one value); {} for a rule without one
    rule_state: dict[str, list[float]] = field(default_factory=dict)
    time_draft_s: float = 0.0
    time_verify_s: float = 0.0
    time_total_s: float = 0.0

    def __post_init__(self):
        if not self.accepted_per_position:
            self.accepted_per_position = [0] * self.draft_length
        if not self.proposed_per_position:
            self.proposed_per_position = [0] * self.draft_length

    @property
    def acceptance_rate(self) -> float:
        """Accepted drafts / proposed drafts."""
        return self.drafts_accepted / self.drafts_proposed if self.drafts_proposed else 0.0

    @property
    def acceptance_rate_per_position(self) -> list[float]:
        """Share of the drafts proposed at position i (0-based) that were accepted."""
        return [a / p if p else 0.0 for a, p in zip(self.accepted_per_position, self.proposed_per_position)]

    @property
    def mean_acceptance_length(self) -> float:
        """tau: tokens emitted per sequence round, bonus included (1.0 for AR). Stats without
        `emitted_tokens` (made by hand, or stored before it existed) count rounds + accepted drafts."""
        if not self.sequence_rounds:
            return 0.0
        if self.emitted_tokens:
            return self.emitted_tokens / self.sequence_rounds
        return (self.sequence_rounds + self.drafts_accepted) / self.sequence_rounds

    @classmethod
    def merge(cls, parts: list["GenerationStats"]) -> "GenerationStats":
        """Sum of the counts and times of several calls (same draft length)."""
        lengths = {p.draft_length for p in parts}
        if len(lengths) > 1:
            raise ValueError(f"cannot merge stats of different draft lengths {sorted(lengths)}")
        out = cls(draft_length=lengths.pop() if lengths else 0)
        for p in parts:
            for f in fields(cls):
                if f.name == "draft_length":
                    continue
                if f.name == "rule_state":  # per sequence: the parts' sequences one after the other
                    for name, values in p.rule_state.items():
                        out.rule_state.setdefault(name, []).extend(values)
                elif f.name.endswith("_per_position"):
                    setattr(out, f.name, [a + b for a, b in zip(getattr(out, f.name), getattr(p, f.name))])
                else:
                    setattr(out, f.name, getattr(out, f.name) + getattr(p, f.name))
        return out

    def as_dict(self, per_result: bool = False) -> dict:
        """Every field plus the derived rates (JSON-ready). per_result: without the fields that only the
        whole call has (forward calls and times are batched over every prompt; 0 in a result's stats)."""
        out = {**asdict(self), "acceptance_rate": self.acceptance_rate,
               "acceptance_rate_per_position": self.acceptance_rate_per_position,
               "mean_acceptance_length": self.mean_acceptance_length}
        return {k: v for k, v in out.items() if k not in BATCH_ONLY} if per_result else out

    @classmethod
    def from_dict(cls, data: dict) -> "GenerationStats":
        """Inverse of as_dict (derived keys ignored)."""
        return cls(**{f.name: data[f.name] for f in fields(cls) if f.name in data})
