import math

import pytest

from relaxspec.bench.speedup import (Interval, length_adjusted_speedup, lossless_within_ci, mean_ci,
                                     modelled_speedup, paired_diff_ci, t_quantile)


def test_modelled_speedup_known_numbers():
    assert modelled_speedup(3.0, 5, 0.2) == pytest.approx(1.5)  # 3 / (1 + 1)
    assert modelled_speedup(2.5, 4, 0.05) == pytest.approx(2.5 / 1.2)
    assert modelled_speedup(1.0, 0, 0.5) == 1.0  # AR
    with pytest.raises(ValueError):
        modelled_speedup(2.0, -1, 0.1)


def test_length_adjusted():
    assert length_adjusted_speedup(2.0, 100, 125) == pytest.approx(1.6)  # rambling answers cost speed
    assert length_adjusted_speedup(2.0, 100, 80) == pytest.approx(2.5)
    assert math.isnan(length_adjusted_speedup(2.0, 100, 0))


def test_mean_ci_known_data():
    ci = mean_ci([1, 2, 3, 4, 5])  # mean 3, sd sqrt(2.5), t_4 = 2.776
    half = 2.776 * math.sqrt(2.5 / 5)
    assert ci.mean == 3 and ci.n == 5
    assert ci.low == pytest.approx(3 - half) and ci.high == pytest.approx(3 + half)
    big = mean_ci([0, 1] * 500)  # normal regime: 1.96 * 0.5 / sqrt(1000) roughly
    assert big.half_width == pytest.approx(1.96 * math.sqrt(0.25 * 1000 / 999) / math.sqrt(1000), rel=1e-3)
    assert mean_ci([1, 1, 1]).half_width == 0
    assert math.isnan(mean_ci([0.5]).low) and math.isnan(mean_ci([]).mean)


def test_t_quantile():
    assert t_quantile(1) == pytest.approx(12.706)
    assert t_quantile(10) == pytest.approx(2.228)
    assert 2.021 > t_quantile(45) > 2.009
    assert t_quantile(10_000) == pytest.approx(1.95996, abs=1e-4)


def test_paired_diff_pairs_by_key():
    base = {(0, 0): 1.0, (1, 0): 0.0, (2, 0): 1.0, (3, 0): 1.0}
    method = {(0, 0): 1.0, (1, 0): 0.0, (2, 0): 0.0, (3, 0): 1.0, (9, 9): 1.0}  # (9, 9) has no partner
    diff = paired_diff_ci(method, base)
    assert diff.n == 4 and diff.mean == pytest.approx(-0.25)
    # pairing removes the between-prompt variance: identical utilities give a zero-width interval
    same = paired_diff_ci(base, base)
    assert same.low == same.high == 0.0
    assert lossless_within_ci(same)
    assert not lossless_within_ci(Interval(-0.2, -0.3, -0.1, 10))
    assert lossless_within_ci(Interval(0.2, 0.1, 0.3, 10))
