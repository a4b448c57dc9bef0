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
A ratio of means gets Fieller's interval with a cluster-robust variance (prompts as clusters) and a t quantile.
"""

from __future__ import annotations

import math

from relaxspec.bench.stats import Interval, cluster_of

OBJECTIVES = ("length-adjusted", "modelled", "measured-bs1")


def round_cost(draft_length: int, extra: int, c_rel: float, c_block: float) -> float:
    """Verifier one-token steps a speculative round costs: (N + extra) drafter steps and one verify block."""
    return (draft_length + extra) * c_rel + c_block


def rounds(row) -> float:
    tau = row.stats.get("mean_acceptance_length") or 1.0
    return row.tokens / tau


def ratio_interval(a: list[float], b: list[float], confidence: float, clusters=None) -> Interval:
    """mean(a) / mean(b) for paired samples with Fieller's interval: the ratios R with (mean(a) - R mean(b))^2
    <= t^2 Var(mean(a) - R mean(b)), the variance cluster-robust (CR1; `clusters`: one label per sample, e.g. its
    prompt; None: independent samples) and t on (clusters - 1) degrees of freedom. Unlike a normal interval on
    the log of the ratio it needs no large sample: it holds exactly for normal means at any size, and it is
    unbounded ([0, inf]) when mean(b) is not clearly positive. Minimum: 2 clusters (fewer give [0, inf])."""
    import numpy as np

    from relaxspec.bench.stats import t_value
    n = len(a)
    if n == 0 or n != len(b):
        return Interval(math.nan, math.nan, math.nan, 0, confidence)
    x, y = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    ma, mb = float(x.mean()), float(y.mean())
    if ma <= 0 or mb <= 0:
        return Interval(math.nan, math.nan, math.nan, n, confidence)
    ratio = ma / mb
    _, inverse = np.unique(np.asarray(range(n) if clusters is None else clusters), return_inverse=True)
    g = int(inverse.max()) + 1
    if g < 2:
        return Interval(ratio, 0.0, math.inf, n, confidence, g)
    ea = np.bincount(inverse, weights=x - ma, minlength=g)
    eb = np.bincount(inverse, weights=y - mb, minlength=g)
    scale = g / (g - 1) / n ** 2
    vaa, vbb, vab = scale * float(ea @ ea), scale * float(eb @ eb), scale * float(ea @ eb)
    t2 = t_value(confidence, g - 1) ** 2
    qa, qb, qc = mb * mb - t2 * vbb, ma * mb - t2 * vab, ma * ma - t2 * vaa
    disc = qb * qb - qa * qc
    if qa <= 0 or disc < 0:
        return Interval(ratio, 0.0, math.inf, n, confidence, g)
    root = math.sqrt(disc)
    return Interval(ratio, max(0.0, (qb - root) / qa), (qb + root) / qa, n, confidence, g)


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
        return ratio_interval([rows[k].tokens for k in keys], [rounds(rows[k]) * cost for k in keys], confidence,
                              [cluster_of(k) for k in keys])
    if objective == "length-adjusted":
        keys = sorted(set(rows) & set(ar_rows or {}))
        return ratio_interval([ar_rows[k].tokens for k in keys], [rounds(rows[k]) * cost for k in keys], confidence,
                              [cluster_of(k) for k in keys])
    raise ValueError(f"unknown objective {objective!r}; known: {', '.join(OBJECTIVES)}")
