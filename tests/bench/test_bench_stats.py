import math
import random

import pytest

from relaxspec.bench.metrics import decision_confidence, identical_fraction
from relaxspec.bench.speedup import block_aware_speedup, length_adjusted_speedup, modelled_speedup
from relaxspec.bench.stats import (BEYOND, NO_STRICT, PRECISE, STRADDLES, WITHIN, Interval, decision,
                                   paired_diff_interval, samples_needed, utility_interval, z_value)

from conftest import benchmark_module

Z95 = 1.959963984540054


def test_modelled_speedups_known_numbers():
    assert modelled_speedup(3.0, 5, 0.2) == pytest.approx(1.5)  # 3 / (1 + 1)
    assert modelled_speedup(3.0, 4, 0.2, extra=1) == pytest.approx(1.5)  # an extra drafter pass costs like N+1
    assert modelled_speedup(1.0, 0, 0.5) == 1.0  # AR
    assert block_aware_speedup(3.0, 4, 0.25, c_block=1.0) == pytest.approx(modelled_speedup(3.0, 4, 0.25))
    assert block_aware_speedup(3.0, 4, 0.25, c_block=2.0) == pytest.approx(1.0)  # 3 / (1 + 2)
    assert block_aware_speedup(3.0, 3, 0.25, c_block=2.0, extra=1) == pytest.approx(1.0)
    with pytest.raises(ValueError):
        modelled_speedup(2.0, -1, 0.1)
    with pytest.raises(ValueError):
        block_aware_speedup(2.0, 3, 0.1, c_block=0.0)


def test_length_adjusted():
    assert length_adjusted_speedup(2.0, 100, 125) == pytest.approx(1.6)  # rambling answers cost speed
    assert math.isnan(length_adjusted_speedup(2.0, 100, 0))


def _wilson_cc(k, n, z=Z95):
    """Newcombe (1998) method 4, transcribed: Wilson's score interval with continuity correction."""
    p = k / n
    lo = (2 * n * p + z * z - 1 - z * math.sqrt(z * z - 2 - 1 / n + 4 * p * (n * (1 - p) + 1))) / (2 * (n + z * z))
    hi = (2 * n * p + z * z + 1 + z * math.sqrt(z * z + 2 - 1 / n + 4 * p * (n * (1 - p) - 1))) / (2 * (n + z * z))
    return max(0.0, lo) if k else 0.0, min(1.0, hi) if k < n else 1.0


def test_wilson_known_answers_and_bounds():
    for k, n in ((0, 10), (10, 10), (50, 100), (21, 30), (3, 80)):
        ci = utility_interval([1.0] * k + [0.0] * (n - k))
        assert (ci.low, ci.high) == pytest.approx(_wilson_cc(k, n), abs=1e-12) and ci.mean == k / n
    # exact coverage at n = 30, p = 0.7 (where Wilson without the correction covers 0.930)
    covered = sum(math.comb(30, k) * 0.7 ** k * 0.3 ** (30 - k) * (lo <= 0.7 <= hi)
                  for k in range(31) for lo, hi in [_wilson_cc(k, 30)])
    assert covered > 0.95
    rng = random.Random(0)
    for _ in range(200):  # fractional utilities, tiny samples, extremes: never outside [0, 1]
        xs = [rng.choice([0.0, 1.0, rng.random()]) for _ in range(rng.randint(1, 6))]
        ci = utility_interval(xs)
        assert 0.0 <= ci.low <= ci.mean <= ci.high <= 1.0
    assert math.isnan(utility_interval([]).mean)
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        utility_interval([1.5])


def _tango_z(b, c, n, delta):
    """Tango (1998), transcribed: Z = (b - c - n delta) / sqrt(n (2 q21 + delta (1 - delta)))."""
    A, B, C = 2 * n, -b - c + (2 * n - b + c) * delta, -c * delta * (1 - delta)
    q21 = (math.sqrt(B * B - 4 * A * C) - B) / (2 * A)
    return (b - c - n * delta) / math.sqrt(n * (2 * q21 + delta * (1 - delta)))


def test_paired_interval_known_answers():
    same = {i: 1.0 for i in range(100)}
    zero = paired_diff_interval(same, same)  # no pair differs: +-z^2/(n+z^2), not the t interval's [0, 0]
    assert zero.mean == 0 and zero.high == pytest.approx(Z95 ** 2 / (100 + Z95 ** 2), rel=1e-6)
    assert zero.low == pytest.approx(-zero.high)
    # 6 pairs where the method wins, 2 where it loses, 92 ties, one key without a partner
    base = {i: 1.0 for i in range(100)}
    method = {**base, **{i: 0.0 for i in range(2)}, (9, 9): 1.0}
    for i in range(2, 8):
        base[i] = 0.0
    diff = paired_diff_interval(method, base)
    assert diff.n == 100 and diff.mean == pytest.approx(0.04)
    assert _tango_z(6, 2, 100, diff.low) == pytest.approx(Z95, abs=1e-6)  # the ends are where |Z| = z
    assert _tango_z(6, 2, 100, diff.high) == pytest.approx(-Z95, abs=1e-6)
    assert diff.low < 0.04 < diff.high
    wider = paired_diff_interval(method, base, confidence=decision_confidence(3))
    assert wider.low < diff.low and wider.high > diff.high and wider.confidence == pytest.approx(1 - 0.05 / 3)
    assert z_value(1 - 0.05 / 3) == pytest.approx(2.3940, abs=1e-4)


def test_paired_interval_bounds_and_coverage():
    rng = random.Random(1)
    for _ in range(200):  # always inside [-1, 1], also for fractional utilities and all-loss samples
        n = rng.randint(1, 8)
        m = {i: rng.choice([0.0, 1.0, rng.random()]) for i in range(n)}
        s = {i: rng.choice([0.0, 1.0, rng.random()]) for i in range(n)}
        d = paired_diff_interval(m, s)
        assert -1.0 <= d.low <= d.mean <= d.high <= 1.0
    # exact coverage over every outcome of n = 100 pairs with P(win) = 0.05, P(loss) = 0.02
    n, p_win, p_loss = 100, 0.05, 0.02
    covered = 0.0
    for b in range(35):
        for c in range(35):
            log_p = (math.lgamma(n + 1) - math.lgamma(b + 1) - math.lgamma(c + 1) - math.lgamma(n - b - c + 1)
                     + b * math.log(p_win) + c * math.log(p_loss) + (n - b - c) * math.log(1 - p_win - p_loss))
            d = paired_diff_interval({i: float(i < b) for i in range(n)},
                                     {i: float(b <= i < b + c) for i in range(n)})
            covered += math.exp(log_p) * (d.low <= p_win - p_loss <= d.high)
    assert 0.93 < covered < 0.98


def test_decisions():
    assert decision(Interval(-0.01, -0.02, 0.0, 500), 0.03) == WITHIN
    assert decision(Interval(-0.2, -0.25, -0.15, 500), 0.03) == BEYOND
    assert decision(Interval(-0.03, -0.05, -0.01, 500), 0.03) == PRECISE  # straddles, but half-width 0.02
    assert decision(Interval(0.0, -0.07, 0.07, 100), 0.03) == STRADDLES
    assert decision(Interval(math.nan, math.nan, math.nan, 0), 0.03) == NO_STRICT
    assert samples_needed(Interval(0.0, -0.06, 0.06, 100), 0.03) == 400
    assert samples_needed(Interval(0.0, -0.01, 0.01, 100), 0.03) == 100
    assert identical_fraction({(0, 0): "a", (1, 0): "b", (2, 0): "c"}, {(0, 0): "a", (1, 0): "x"}) == 0.5
    assert math.isnan(identical_fraction({}, {(0, 0): "a"}))


def test_clustered_intervals_cover_on_clustered_data():
    """95% intervals on data with per-prompt difficulty, 30 / 80 prompts x 1-8 repeats, paired differences
    mostly exactly zero (benchmarks/interval_coverage.py has the data-generating process). 1500 runs per
    setting: Monte Carlo s.e. 0.0056 at 0.95, so >= 0.93 fails a method whose coverage is 0.95 with
    probability < 1e-3 per setting, and one at 0.91 almost surely. The independent-samples column (today's
    intervals) is printed beside it (pytest -s)."""
    cov = benchmark_module("interval_coverage")
    rows = cov.table(1500)
    print("\n" + cov.format_table(rows, 1500))
    for scenario, prompts, repeats, clustered, independent, *_ in rows:
        assert clustered >= 0.93, (scenario, prompts, repeats, clustered)
        if repeats == 1:  # one sample per prompt: the same interval
            assert clustered == independent
    assert min(r[4] for r in rows if r[2] == 8) < 0.85  # the defect: ignoring prompts undercovers


def test_design_effect_known_cases():
    from relaxspec.bench.stats import design_effect, diff_interval
    # every prompt's repeats identical: the samples are copies, deff is the repeats (capped at m_max)
    xs = [float(i % 3 == 0) for i in range(40) for _ in range(4)]
    deff, g = design_effect(xs, [i for i in range(40) for _ in range(4)], 0.3 * 0.7)
    assert g == 40 and deff == pytest.approx(4.0)
    # no variation: one sample per prompt
    zero = diff_interval([0.0] * 320, [i // 8 for i in range(320)])
    assert zero.design_effect == 8 and zero.high == pytest.approx(Z95 ** 2 / (40 + Z95 ** 2), rel=1e-6)
    # one sample per prompt: Tango unchanged
    same = diff_interval([1.0, -1.0, 0.0, 0.0] * 25, list(range(100)))
    assert same == diff_interval([1.0, -1.0, 0.0, 0.0] * 25)
    # (prompt, repeat) keys are clustered by prompt
    m = {(i, r): float(i < 3) for i in range(30) for r in range(4)}
    s = {(i, r): 0.0 for i in range(30) for r in range(4)}
    assert paired_diff_interval(m, s).clusters == 30 and paired_diff_interval(m, s).design_effect > 1
