"""Confidence intervals for bounded utilities and their paired differences, with prompts as clusters.

* a utility's mean (values in [0, 1]): the Wilson score interval with continuity correction (Newcombe 1998,
  method 4; plain Wilson dips to 0.93 at n = 30, p = 0.7). For 0/1 utilities it is that interval itself;
  for fractional ones it uses the Bernoulli variance bound m(1 - m) >= Var (a value in [0, 1]
  with mean m has at most that variance), so it stays valid (conservative). It never leaves [0, 1].
* a paired difference (method - baseline, paired by (prompt, repeat)): Tango's score interval for paired
  proportions, with b = sum of the positive parts of the differences and c = sum of the negative parts
  (the discordant counts when utilities are 0/1). With coupled methods most differences are exact zeros;
  a paired t or bootstrap interval then collapses to [0, 0] when no pair differs, while the score interval
  keeps the width the sample size allows (b = c = 0 gives +-z^2 / (n + z^2)). For fractional utilities the
  variance it assumes is an upper bound (d^2 <= |d| for d in [-1, 1]), so it stays valid. It never leaves
  [-1, 1].

Clusters (several samples per prompt): samples of one prompt are not independent (a hard prompt is hard at
every repeat), so both intervals are taken at the Rao-Scott effective sample size (Rao and Scott 1992) with a
Korn-Graubard degrees-of-freedom correction (Korn and Graubard 1998): the design effect deff = V_CR1 / V_0
compares the cluster-robust variance of the mean (CR1: prompts as clusters, factor G / (G - 1)) with the
variance the interval assumes for independent samples (V_0: m(1 - m) / n for a mean, Tango's
(mean|d| - mean(d)^2) / n for a difference), at least 1, times (t_df / z)^2 with df the effective number of
prompts that carry the variance, (sum e_g^2)^2 / sum e_g^4 over the prompts' centred totals e_g (between 1
and G - 1: with most differences exactly zero only the few prompts that differ estimate the variance, and a
t on G - 1 df would trust it too much); deff is at most m_max, the most samples of one prompt (a true design
effect over these variance bounds never exceeds it; at m_max the interval is the one-sample-per-prompt one).
The interval is the same score interval at n / deff samples (b / deff, c / deff; the mean is unchanged). When
nothing varies (every difference zero, every utility equal) deff = m_max: an effect concentrated in prompts
never drawn is possible, and G prompts are all the evidence. With one sample per prompt deff = 1: the
independent-samples intervals, unchanged. Coverage on clustered data with most differences exactly zero
is measured by tests/bench/test_bench_stats.py (benchmarks/interval_coverage.py prints the table).

* a ratio of means of paired positive samples (speed-ups): Fieller's interval with a cluster-robust variance
  and a t quantile on clusters - 1 degrees of freedom (ratio_interval).

Keys: a (prompt, repeat) tuple is clustered by its prompt (key[0]); any other key is its own cluster.

A relaxed cell's decision: its interval of (utility - strict's) against the budget -max_drop, wholly within it
(WITHIN), wholly beyond it (BEYOND), narrow enough, still straddling it, or no strict cell to compare with
(NO_STRICT) (decision, samples_needed).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np

CONFIDENCE = 0.95
METHOD = ("score intervals (utility: continuity-corrected Wilson; differences: Tango) at the Rao-Scott effective "
          "sample size n / deff, prompts as clusters: deff = CR1 variance / the independent-samples one, times "
          "(t_df / z)^2 (df: prompts carrying the variance), within [1, samples per prompt]; deff = 1 with one "
          "sample per prompt")

# what the layers above use (relaxspec.bench.stats)
__all__ = ["Interval", "paired_diff_interval", "ratio", "ratio_interval", "decision", "WITHIN", "BEYOND", "NO_STRICT",
           "format_interval", "MISSING"]


@dataclass(frozen=True)
class Interval:
    mean: float
    low: float
    high: float
    n: int
    confidence: float = CONFIDENCE
    clusters: int = 0  # prompts the samples come from (0: not counted)
    design_effect: float = 1.0  # the n / effective-n the interval used

    @property
    def half_width(self) -> float:
        return (self.high - self.low) / 2


MISSING = "-"  # how the reports spell a value or an interval that is not there (None, "" or NaN)


def format_interval(interval, fmt: str = "{:.3f}") -> str:
    """An interval as every report writes it, "mean [low, high]" with each number in `fmt`: `interval` an `Interval`,
    a (mean, low, high) triple or None. No mean (None, "" or NaN): "-"; a mean without bounds: the mean alone."""
    mean, low, high = (None, None, None) if interval is None else \
        (interval.mean, interval.low, interval.high) if isinstance(interval, Interval) else interval
    if _missing(mean):
        return MISSING
    if _missing(low) or _missing(high):
        return fmt.format(mean)
    return f"{fmt.format(mean)} [{fmt.format(low)}, {fmt.format(high)}]"


def _missing(x) -> bool:
    return x is None or x == "" or (isinstance(x, float) and math.isnan(x))


NAN_INTERVAL = Interval(math.nan, math.nan, math.nan, 0)


def ratio(numerator: float, denominator: float) -> float:
    """numerator / denominator, NaN (shown as "-") where it has no value: a zero or NaN denominator
    (a cell that emitted no tokens, a speed-up of 0)."""
    if denominator == 0 or math.isnan(denominator) or math.isnan(numerator):
        return math.nan
    return numerator / denominator


def z_value(confidence: float) -> float:
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must lie in (0, 1), got {confidence}")
    return NormalDist().inv_cdf(0.5 + confidence / 2)


def t_value(confidence: float, df: float) -> float:
    """Two-sided Student t quantile t_{df, (1 + confidence) / 2}. df >= 5: the Cornish-Fisher expansion in 1/df
    (Abramowitz and Stegun 26.7.5; error < 1e-3, shrinking as df grows); df < 5: df rounded down (a wider
    interval) and the exact CDF of integer df (A&S 26.7.3-4) solved by bisection."""
    z = z_value(confidence)
    if math.isinf(df):
        return z
    if df < 1:
        raise ValueError(f"degrees of freedom must be >= 1, got {df}")
    if df < 5:
        nu = int(df)
        return _solve(lambda t: _t_central(t, nu) - confidence, 0.0, 1e6, increasing=True)
    g1 = (z ** 3 + z) / 4
    g2 = (5 * z ** 5 + 16 * z ** 3 + 3 * z) / 96
    g3 = (3 * z ** 7 + 19 * z ** 5 + 17 * z ** 3 - 15 * z) / 384
    g4 = (79 * z ** 9 + 776 * z ** 7 + 1482 * z ** 5 - 1920 * z ** 3 - 945 * z) / 92160
    return z + g1 / df + g2 / df ** 2 + g3 / df ** 3 + g4 / df ** 4


def _t_central(t: float, nu: int) -> float:
    """P(|T| <= t) for Student's t with integer nu degrees of freedom (Abramowitz and Stegun 26.7.3-4)."""
    theta = math.atan(t / math.sqrt(nu))
    c2, s = math.cos(theta) ** 2, math.sin(theta)
    if nu % 2:  # odd
        term, total = 1.0, 1.0 if nu > 1 else 0.0
        for k in range(1, (nu - 1) // 2):
            term *= c2 * (2 * k) / (2 * k + 1)
            total += term
        return 2 / math.pi * (theta + s * math.cos(theta) * total)
    term, total = 1.0, 1.0
    for k in range(1, nu // 2):
        term *= c2 * (2 * k - 1) / (2 * k)
        total += term
    return s * total


def cluster_of(key):
    """A sample's cluster: its prompt for a (prompt, repeat) key, the key itself otherwise."""
    return key[0] if isinstance(key, tuple) else key


def design_effect(values, clusters, base_variance: float, confidence: float = CONFIDENCE) -> tuple[float, int]:
    """(deff, number of clusters) for the mean of `values` (see the module doc): CR1 variance over the
    variance `base_variance` / n an independent-samples interval assumes (at least 1) times (t_df / z)^2, at
    most m_max; m_max when nothing varies; 1 when no cluster holds two samples."""
    x = np.asarray(values, dtype=np.float64)
    n = x.size
    _, inverse, sizes = np.unique(np.asarray(clusters), return_inverse=True, return_counts=True)
    g = sizes.size
    m_max = int(sizes.max()) if n else 1
    if m_max <= 1 or g < 2:
        return (float(m_max) if g == 1 else 1.0), g
    totals = np.bincount(inverse, weights=x - x.mean(), minlength=g)
    squares = totals * totals
    sum_sq = float(squares.sum())
    if base_variance <= 1e-15 or sum_sq <= 1e-15:
        return float(m_max), g
    v_cr1 = g / (g - 1) * sum_sq / n ** 2
    df = min(g - 1.0, max(1.0, sum_sq ** 2 / float(np.dot(squares, squares))))
    deff = max(v_cr1 / (base_variance / n), 1.0) * (t_value(confidence, df) / z_value(confidence)) ** 2
    return min(deff, float(m_max)), g


def _check_unit(values, what: str) -> list[float]:
    xs = [float(v) for v in values]
    if any(not (0.0 <= x <= 1.0) for x in xs):
        raise ValueError(f"{what} must lie in [0, 1]")
    return xs


def utility_interval(values, confidence: float = CONFIDENCE, clusters=None) -> Interval:
    """Mean of utilities in [0, 1] with its continuity-corrected Wilson interval, at the effective sample size when
    `clusters` (one label per value, e.g. the prompt index) repeats labels (see the module doc)."""
    xs = _check_unit(values, "utilities")
    n = len(xs)
    if n == 0:
        return NAN_INTERVAL
    m = sum(xs) / n
    deff, g = design_effect(xs, clusters, m * (1 - m), confidence) if clusters is not None else (1.0, n)
    ne, z = n / deff, z_value(confidence)
    z2 = z * z
    root = lambda sign: math.sqrt(max(0.0, z2 + sign * 2 - 1 / ne + 4 * m * (ne * (1 - m) - sign)))  # noqa: E731
    # (the ends are kept around the mean: the correction's root can pass it at fractional means and tiny n)
    low = 0.0 if m == 0 else max(0.0, min(m, (2 * ne * m + z2 - 1 - z * root(-1)) / (2 * (ne + z2))))
    high = 1.0 if m == 1 else min(1.0, max(m, (2 * ne * m + z2 + 1 + z * root(1)) / (2 * (ne + z2))))
    return Interval(m, low, high, n, confidence, g, deff)


def paired_keys(method: dict, baseline: dict) -> list:
    return sorted(set(method) & set(baseline))


def paired_diff_interval(method: dict, baseline: dict, confidence: float = CONFIDENCE) -> Interval:
    """mean(method - baseline) over the keys both have, Tango's score interval; (prompt, repeat) keys are
    clustered by prompt (see the module doc)."""
    keys = paired_keys(method, baseline)
    _check_unit([method[k] for k in keys] + [baseline[k] for k in keys], "utilities")
    return diff_interval([float(method[k]) - float(baseline[k]) for k in keys], [cluster_of(k) for k in keys],
                         confidence)


def diff_interval(diffs, clusters=None, confidence: float = CONFIDENCE) -> Interval:
    """Mean of paired differences in [-1, 1] with Tango's score interval at the effective sample size
    (`clusters`: one label per difference; None: independent samples)."""
    d = np.asarray(diffs, dtype=np.float64)
    n = int(d.size)
    if n == 0:
        return NAN_INTERVAL
    if np.any(np.abs(d) > 1.0 + 1e-12):
        raise ValueError("paired differences must lie in [-1, 1]")
    b = float(d[d > 0].sum())
    c = float(-d[d < 0].sum())
    mean = (b - c) / n
    if clusters is None:
        deff, g = 1.0, n
    else:
        deff, g = design_effect(d, clusters, (b + c) / n - mean * mean, confidence)
    z = z_value(confidence)
    be, ce, ne = b / deff, c / deff, n / deff
    low = _solve(lambda delta: _tango_z(be, ce, ne, delta) - z, -1.0, mean)
    high = _solve(lambda delta: _tango_z(be, ce, ne, delta) + z, mean, 1.0)
    return Interval(mean, low, high, n, confidence, g, deff)


def _tango_z(b: float, c: float, n: float, delta: float) -> float:
    """Tango's (1998) score statistic for H0: P(method better) - P(baseline better) = delta."""
    a2 = 2.0 * n
    bb = -b - c + (2.0 * n - b + c) * delta
    cc = -c * delta * (1.0 - delta)
    p21 = (math.sqrt(max(bb * bb - 4.0 * a2 * cc, 0.0)) - bb) / (2.0 * a2)
    var = n * (2.0 * p21 + delta * (1.0 - delta))
    num = b - c - n * delta
    if var <= 1e-15:
        return 0.0 if abs(num) < 1e-12 else math.copysign(math.inf, num)
    return num / math.sqrt(var)


def _solve(f, lo: float, hi: float, increasing: bool = False) -> float:
    """Root of a decreasing (or increasing) function on [lo, hi] by bisection (the end itself when f keeps
    one sign)."""
    g = (lambda x: -f(x)) if increasing else f
    if g(lo) <= 0:
        return lo
    if g(hi) >= 0:
        return hi
    for _ in range(60):
        mid = (lo + hi) / 2
        if g(mid) > 0:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def ratio_interval(a: list[float], b: list[float], confidence: float, clusters=None) -> Interval:
    """mean(a) / mean(b) for paired samples with Fieller's interval: the ratios R with (mean(a) - R mean(b))^2
    <= t^2 Var(mean(a) - R mean(b)), the variance cluster-robust (CR1; `clusters`: one label per sample, e.g. its
    prompt; None: independent samples) and t on (clusters - 1) degrees of freedom. Unlike a normal interval on
    the log of the ratio it needs no large sample: it holds exactly for normal means at any size, and it is
    unbounded ([0, inf]) when mean(b) is not clearly positive. Minimum: 2 clusters (fewer give [0, inf])."""
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
    if qa <= 0:  # mean(b) not clearly positive: every ratio is possible
        return Interval(ratio, 0.0, math.inf, n, confidence, g)
    root = math.sqrt(max(0.0, qb * qb - qa * qc))  # >= 0 up to rounding: the estimate is always inside
    return Interval(ratio, max(0.0, (qb - root) / qa), (qb + root) / qa, n, confidence, g)


# ---------------------------------------------------------------------------------------------
# A relaxed cell's interval of (utility - strict's) against the budget

WITHIN, BEYOND, PRECISE, STRADDLES, NO_STRICT = ("within budget", "beyond budget", "half-width <= budget",
                                                  "straddles the budget", "no strict cell to compare with")


def decision(diff: Interval, max_drop: float) -> str:
    """The state of a relaxed cell's interval of (utility - strict's) against the budget -max_drop:
    wholly within, wholly beyond, narrow enough (half-width <= max_drop), or still straddling it."""
    if diff.n == 0 or math.isnan(diff.low):
        return NO_STRICT
    if diff.low >= -max_drop:
        return WITHIN
    if diff.high < -max_drop:
        return BEYOND
    if diff.half_width <= max_drop:
        return PRECISE
    return STRADDLES


def is_decided(state: str) -> bool:
    return state in (WITHIN, BEYOND, PRECISE)


def samples_needed(diff: Interval, max_drop: float) -> int:
    """Independent samples (one per new prompt) for the interval's half-width to shrink to max_drop (width ~
    1/sqrt(n) at the effective sample size n / design effect the interval used)."""
    if diff.n == 0 or max_drop <= 0 or diff.half_width <= max_drop:
        return diff.n
    return math.ceil(diff.n / diff.design_effect * (diff.half_width / max_drop) ** 2)
