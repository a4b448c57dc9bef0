"""Confidence intervals for bounded utilities and their paired differences.

* a utility's mean (values in [0, 1]): the Wilson score interval. For 0/1 utilities it is Wilson's own
  interval; for fractional ones it uses the Bernoulli variance bound m(1 - m) >= Var (a value in [0, 1]
  with mean m has at most that variance), so it stays valid (conservative). It never leaves [0, 1].
* a paired difference (method - baseline, paired by (prompt, repeat)): Tango's score interval for paired
  proportions, with b = sum of the positive parts of the differences and c = sum of the negative parts
  (the discordant counts when utilities are 0/1). With coupled methods most differences are exact zeros;
  a paired t or bootstrap interval then collapses to [0, 0] when no pair differs, while the score interval
  keeps the width the sample size allows (b = c = 0 gives +-z^2 / (n + z^2)). For fractional utilities the
  variance it assumes is an upper bound (d^2 <= |d| for d in [-1, 1]), so it stays valid. It never leaves
  [-1, 1].
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist

CONFIDENCE = 0.95


@dataclass(frozen=True)
class Interval:
    mean: float
    low: float
    high: float
    n: int
    confidence: float = CONFIDENCE

    @property
    def half_width(self) -> float:
        return (self.high - self.low) / 2


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


def _check_unit(values, what: str) -> list[float]:
    xs = [float(v) for v in values]
    if any(not (0.0 <= x <= 1.0) for x in xs):
        raise ValueError(f"{what} must lie in [0, 1]")
    return xs


def utility_interval(values, confidence: float = CONFIDENCE) -> Interval:
    """Mean of utilities in [0, 1] with its Wilson score interval (see the module doc)."""
    xs = _check_unit(values, "utilities")
    n = len(xs)
    if n == 0:
        return NAN_INTERVAL
    m = sum(xs) / n
    z2 = z_value(confidence) ** 2
    centre = (m + z2 / (2 * n)) / (1 + z2 / n)
    half = math.sqrt(z2) / (1 + z2 / n) * math.sqrt(m * (1 - m) / n + z2 / (4 * n * n))
    low = 0.0 if m == 0 else max(0.0, centre - half)  # exact ends where rounding would leave a 1e-17
    high = 1.0 if m == 1 else min(1.0, centre + half)
    return Interval(m, low, high, n, confidence)


def paired_keys(method: dict, baseline: dict) -> list:
    return sorted(set(method) & set(baseline))


def paired_diff_interval(method: dict, baseline: dict, confidence: float = CONFIDENCE) -> Interval:
    """mean(method - baseline) over the keys both have (e.g. (prompt_index, repeat)), Tango's score
    interval (see the module doc)."""
    keys = paired_keys(method, baseline)
    diffs = [float(method[k]) - float(baseline[k]) for k in keys]
    _check_unit([method[k] for k in keys] + [baseline[k] for k in keys], "utilities")
    n = len(diffs)
    if n == 0:
        return NAN_INTERVAL
    b = sum(d for d in diffs if d > 0)
    c = -sum(d for d in diffs if d < 0)
    z = z_value(confidence)
    mean = (b - c) / n
    low = _solve(lambda delta: _tango_z(b, c, n, delta) - z, -1.0, mean)
    high = _solve(lambda delta: _tango_z(b, c, n, delta) + z, mean, 1.0)
    return Interval(mean, low, high, n, confidence)


def _tango_z(b: float, c: float, n: int, delta: float) -> float:
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


def _solve(f, lo: float, hi: float) -> float:
    """Root of a decreasing function on [lo, hi] by bisection (the end itself when f keeps one sign)."""
    if f(lo) <= 0:
        return lo
    if f(hi) >= 0:
        return hi
    for _ in range(60):
        mid = (lo + hi) / 2
        if f(mid) > 0:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2
