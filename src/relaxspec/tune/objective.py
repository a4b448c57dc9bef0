"""The objectives tune maximises, per sample, with their intervals.

All are ratios of AR's cost to the configuration's cost, in verifier one-token steps; a sample's rounds are
its tokens / its mean acceptance length (bonus included). For a round of draft length N of a rule with
`extra` drafter passes, at drafter / verifier step cost c_rel and verifier (N+1)-block / one-token cost c_block:
* length-adjusted (default): S_len = mean_i(AR tokens_i) / mean_i(rounds_i * ((N + extra) c_rel + c_block)),
  paired by (prompt, repeat) with AR's sample: the block-aware modelled speed-up tau / ((N+extra) c_rel +
  c_block) times L_AR / L_method (docs/design.md, "Metrics");
* modelled: tau / ((N + extra) c_rel + c_block) = mean_i(tokens_i) / mean_i(rounds_i * cost);
  c_block = 1 gives Leviathan's model;
* measured-bs1: batch-1 wall time, AR / method, ratio of medians (the bench's batch-1 timing); no interval.
A ratio of means gets the delta-method interval on its log (normal, paired samples).
"""

from __future__ import annotations

import math
import statistics

from relaxspec.bench.stats import Interval, z_value

OBJECTIVES = ("length-adjusted", "modelled", "measured-bs1")


def round_cost(draft_length: int, extra: int, c_rel: float, c_block: float) -> float:
    """Verifier one-token steps a speculative round costs: (N + extra) drafter steps and one verify block."""
    return (draft_length + extra) * c_rel + c_block


def rounds(row) -> float:
    tau = row.stats.get("mean_acceptance_length") or 1.0
    return row.tokens / tau


def ratio_interval(a: list[float], b: list[float], confidence: float) -> Interval:
    """mean(a) / mean(b) for paired samples, with a delta-method interval on the log of the ratio."""
    n = len(a)
    if n == 0 or n != len(b):
        return Interval(math.nan, math.nan, math.nan, 0, confidence)
    ma, mb = statistics.fmean(a), statistics.fmean(b)
    if ma <= 0 or mb <= 0:
        return Interval(math.nan, math.nan, math.nan, n, confidence)
    ratio = ma / mb
    if n < 2:
        return Interval(ratio, 0.0, math.inf, n, confidence)
    va, vb = statistics.variance(a), statistics.variance(b)
    cov = sum((x - ma) * (y - mb) for x, y in zip(a, b)) / (n - 1)
    var_log = max(0.0, va / ma ** 2 + vb / mb ** 2 - 2 * cov / (ma * mb)) / n
    h = z_value(confidence) * math.sqrt(var_log)
    return Interval(ratio, ratio * math.exp(-h), ratio * math.exp(h), n, confidence)


def speed_interval(objective: str, rows: dict, ar_rows: dict | None, draft_length: int, extra: int, c_rel: float,
                   c_block: float, confidence: float, batch1: float | None = None) -> Interval:
    """The objective of one configuration from its rows ({(prompt, repeat): Row}); AR's rows for the
    length-adjusted objective (only the samples both have count); `batch1` the measured batch-1 speed-up."""
    if objective == "measured-bs1":
        value = math.nan if batch1 is None else batch1
        return Interval(value, math.nan, math.nan, len(rows), confidence)
    cost = round_cost(draft_length, extra, c_rel, c_block)
    if objective == "modelled":
        keys = sorted(rows)
        return ratio_interval([rows[k].tokens for k in keys], [rounds(rows[k]) * cost for k in keys], confidence)
    if objective == "length-adjusted":
        keys = sorted(set(rows) & set(ar_rows or {}))
        return ratio_interval([ar_rows[k].tokens for k in keys], [rounds(rows[k]) * cost for k in keys], confidence)
    raise ValueError(f"unknown objective {objective!r}; known: {', '.join(OBJECTIVES)}")
