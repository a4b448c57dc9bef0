"""Speed-up model and utility statistics.

* modelled speed-up  S = tau / (1 + N * c_rel)   (tau: mean acceptance length, bonus included)
* length-adjusted    S_len = S * L_AR / L_method (L: mean response length in tokens)
* capability         mean utility with a 95% CI over prompts x repeats (Student t)
* paired difference  method - AR, paired by (prompt, repeat), with a 95% CI
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist

C_REL_GRID = (0.05, 0.2, 0.5)

# Two-sided 97.5% quantiles of Student's t for small degrees of freedom; normal beyond.
_T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262,
         10: 2.228, 11: 2.201, 12: 2.179, 13: 2.160, 14: 2.145, 15: 2.131, 16: 2.120, 17: 2.110,
         18: 2.101, 19: 2.093, 20: 2.086, 21: 2.080, 22: 2.074, 23: 2.069, 24: 2.064, 25: 2.060,
         26: 2.056, 27: 2.052, 28: 2.048, 29: 2.045, 30: 2.042, 40: 2.021, 50: 2.009, 60: 2.000,
         80: 1.990, 100: 1.984, 120: 1.980}


def modelled_speedup(tau: float, draft_length: int, c_rel: float) -> float:
    """S = tau / (1 + N * c_rel); AR (N = 0, tau = 1) is 1.0."""
    if draft_length < 0 or c_rel < 0:
        raise ValueError(f"need draft_length >= 0 and c_rel >= 0, got N={draft_length}, c_rel={c_rel}")
    return tau / (1.0 + draft_length * c_rel)


def length_adjusted_speedup(speedup: float, length_ar: float, length_method: float) -> float:
    """S_len = S * L_AR / L_method: a method whose answers are longer finishes later."""
    if length_method <= 0:
        return float("nan")
    return speedup * length_ar / length_method


def t_quantile(df: int, confidence: float = 0.95) -> float:
    """Two-sided critical value: Student's t (table, 95% only) for small df, normal otherwise."""
    if df < 1:
        return float("nan")
    if confidence != 0.95:
        return NormalDist().inv_cdf(0.5 + confidence / 2)
    if df in _T975:
        return _T975[df]
    if df > 120:
        return NormalDist().inv_cdf(0.975)
    lower = max(k for k in _T975 if k < df)
    upper = min(k for k in _T975 if k > df)
    # interpolate in 1/df, which is close to linear for the t quantile
    w = (1 / df - 1 / upper) / (1 / lower - 1 / upper)
    return _T975[upper] + w * (_T975[lower] - _T975[upper])


@dataclass(frozen=True)
class Interval:
    mean: float
    low: float
    high: float
    n: int

    @property
    def half_width(self) -> float:
        return (self.high - self.low) / 2


def mean_ci(values, confidence: float = 0.95) -> Interval:
    """Mean and t-interval. n = 1 gives an unbounded interval (nan ends); n = 0 all nan."""
    xs = [float(v) for v in values]
    n = len(xs)
    if n == 0:
        return Interval(float("nan"), float("nan"), float("nan"), 0)
    mean = sum(xs) / n
    if n == 1:
        return Interval(mean, float("nan"), float("nan"), 1)
    var = sum((x - mean) ** 2 for x in xs) / (n - 1)
    half = t_quantile(n - 1, confidence) * math.sqrt(var / n)
    return Interval(mean, mean - half, mean + half, n)


def paired_diff_ci(method: dict, baseline: dict, confidence: float = 0.95) -> Interval:
    """CI of mean(method - baseline) over the keys (e.g. (prompt_index, repeat)) both have."""
    keys = sorted(set(method) & set(baseline))
    return mean_ci([method[k] - baseline[k] for k in keys], confidence)


def lossless_within_ci(diff: Interval) -> bool:
    """No utility loss detectable: the paired CI of (method - AR) contains 0 or lies above it."""
    if math.isnan(diff.high):
        return False
    return diff.high >= 0
