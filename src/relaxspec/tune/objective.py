"""The objectives tune maximises, per sample, with their intervals.

All are ratios of AR's cost to the configuration's cost, in verifier one-token steps; a sample's rounds are
its tokens / its mean acceptance length (bonus included). For a round of draft length N of a rule with
`extra` drafter passes, at drafter / verifier step cost c_rel, verifier (N+1)-block / one-token cost c_block and,
for a rule that reads a pivot classifier, its call per round / one-token cost c_pivot (0 for the others; the cost
below is then (N + extra) c_rel + c_block + c_pivot, bench.speedup.round_cost, as the bench's S_blk):
* length-adjusted (default): S_len = mean_i(AR tokens_i) / mean_i(rounds_i * ((N + extra) c_rel + c_block)),
  paired by (prompt, repeat) with AR's sample: the block-aware modelled speed-up tau / ((N+extra) c_rel +
  c_block) times L_AR / L_method (docs/design.md, "Metrics");
* modelled: tau / ((N + extra) c_rel + c_block) = mean_i(tokens_i) / mean_i(rounds_i * cost);
  c_block = 1 gives Leviathan's model;
* measured-bs1: batch-1 wall time, AR / method, ratio of medians (the bench's batch-1 timing); no interval.
A ratio of means gets Fieller's interval with a cluster-robust variance (prompts as clusters) and a t quantile.
"""

from __future__ import annotations

import math

from relaxspec.bench import speedup, stats
from relaxspec.names import AUTO

OBJECTIVES = ("length-adjusted", "modelled", "measured-bs1")


def priced_round(draft_length, metrics: dict, c_block: float, dynamic: bool = False) -> tuple[float, float]:
    """(drafts, c_block) a configuration's round is priced at: N and the given c_block; for N "auto" (or `dynamic`:
    a confidence stop), whose drafts per round vary, its cell's measured mean drafts per round and c_block
    interpolated at that width (the bench's model_draft_length and model_c_block, bench.metrics.cell_metrics)."""
    if draft_length != AUTO and not dynamic:
        return draft_length, c_block
    return metrics["model_draft_length"], metrics["model_c_block"]


def speed_interval(objective: str, rows: dict, ar_rows: dict | None, draft_length: int, extra: int, c_rel: float,
                   c_block: float, confidence: float, batch1: float | None = None,
                   c_pivot: float = 0.0) -> stats.Interval:
    """The objective of one configuration from its rows ({(prompt, repeat): Row}); AR's rows for the
    length-adjusted objective (only the samples both have count); `batch1` the measured batch-1 speed-up."""
    if objective == "measured-bs1":
        value = math.nan if batch1 is None else batch1
        return stats.Interval(value, math.nan, math.nan, len(rows), confidence)
    cost = speedup.round_cost(draft_length, c_rel, c_block, extra, c_pivot)
    if objective == "modelled":
        keys = sorted(rows)
        return stats.ratio_interval([rows[k].tokens for k in keys], [speedup.rounds(rows[k]) * cost for k in keys],
                                    confidence, [prompt for prompt, _ in keys])
    if objective == "length-adjusted":
        keys = sorted(set(rows) & set(ar_rows or {}))
        return stats.ratio_interval([ar_rows[k].tokens for k in keys], [speedup.rounds(rows[k]) * cost for k in keys],
                                    confidence, [prompt for prompt, _ in keys])
    raise ValueError(f"unknown objective {objective!r}; known: {', '.join(OBJECTIVES)}")
