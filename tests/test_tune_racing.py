"""Racing on a synthetic objective with a known answer (no model): fake configurations whose paired utilities
and speeds are drawn from known distributions."""

import math
import random
import zlib

import pytest

from relaxspec.bench.stats import Interval, paired_diff_interval, z_value
from relaxspec.tune.racing import HALVED, LOSSY, race
from relaxspec.tune.space import Config, between, make_config, search_space

MAX_DROP = 0.02
SPEED_SD = 0.3  # per-sample sd of the speed measurement


class FakeArm:
    """Paired samples (strict, config): with prob q_neg strict right and the config wrong, else both the same
    Bernoulli(0.8) draw; the speed is the true speed plus N(0, SPEED_SD^2 / n) noise."""

    def __init__(self, truth, config, n, rng_seed):
        speed, q_neg = truth
        rng = random.Random(rng_seed)
        self.config = config
        self.strict, self.mine = {}, {}
        for i in range(n):
            s = float(rng.random() < 0.8)
            m = 0.0 if rng.random() < q_neg else s
            if m != s:
                s = 1.0
            self.strict[i], self.mine[i] = s, m
        self.n = n
        self.speed_mean = speed + rng.gauss(0, SPEED_SD / math.sqrt(n))

    def diff(self, confidence):
        if self.config.is_strict:
            return Interval(0.0, 0.0, 0.0, self.n, confidence)
        return paired_diff_interval(self.mine, self.strict, confidence)

    def speed(self, confidence):
        h = z_value(confidence) * SPEED_SD / math.sqrt(self.n)
        return Interval(self.speed_mean, self.speed_mean - h, self.speed_mean + h, self.n, confidence)


def _problem():
    """60 configurations: strict at N=2..4; a best one; slower lossless ones; lossy ones faster still. Truth:
    config -> (speed, probability the config loses a sample strict wins)."""
    truth = {}
    for n, s in ((2, 1.10), (3, 1.15), (4, 1.05)):
        truth[make_config("strict", {}, n)] = (s, 0.0)
    best = make_config("cactus", {"delta": 0.5}, 3)
    truth[best] = (1.50, 0.0)
    for k in range(36):  # feasible but slower
        truth[make_config("mentored", {"alpha": 0.1 + k / 100}, 2 + k % 3)] = (1.05 + 0.008 * k, 0.0)
    for k in range(20):  # faster than the best, but their true drop exceeds the budget by a margin
        truth[make_config("fuzzy", {"threshold": 0.1 + k / 100}, 2 + k % 3)] = (1.6 + 0.04 * k, 0.07 + 0.01 * (k % 5))
    return truth, best


def _run(seed, sizes=(3, 12, 48, 240), caps=(30, 12, 3)):
    truth, best = _problem()
    evaluated = []

    def evaluate(config, n):
        evaluated.append((config, n))
        return FakeArm(truth[config], config, n, zlib.crc32(f"{seed}|{config.label}|{n}".encode()))

    result = race(list(truth), evaluate, MAX_DROP, lambda c: c.is_strict, sizes=sizes, caps=caps,
                  reference_of=lambda c: c.strict)
    return result, truth, best, evaluated


def test_race_finds_the_true_best_and_never_a_lossy_one():
    found, lossy_chosen = 0, 0
    seeds = range(20)
    for seed in seeds:
        result, truth, best, _ = _run(seed)
        found += result.choice == best
        lossy_chosen += truth[result.choice][1] > MAX_DROP
    assert lossy_chosen == 0
    assert found >= 16, f"true best found in {found} of {len(seeds)} seeds"


def test_race_drops_lossy_configurations_and_spends_less_than_the_grid():
    result, truth, best, evaluated = _run(0)
    lossy = [r for c, r in result.records.items() if truth[c][1] > MAX_DROP]
    assert all(r.dropped is not None or not r.feasible for r in lossy)  # none left certified within budget
    assert {r.dropped for r in lossy} <= {LOSSY, HALVED, None}  # never "clearly slower": they are faster
    spent = sum(n for _, n in evaluated)
    assert spent < len(truth) * 240 / 4, spent  # the grid would give every configuration the last rung's samples
    assert result.rungs_run == 4 and result.stopped == "all rungs"
    for c in result.finalists:  # every finalist's strict reference is a finalist too (sampled with it)
        assert c.strict in result.finalists
    assert result.records[result.choice].feasible


def test_race_stops_when_the_budget_says_so_and_still_chooses():
    truth, _ = _problem()
    calls = []

    def evaluate(config, n):
        calls.append(n)
        return FakeArm(truth[config], config, n, 1)

    result = race(list(truth), evaluate, MAX_DROP, lambda c: c.is_strict, sizes=(3, 12), caps=(5,),
                  fits=lambda alive, n: False)
    assert result.rungs_run == 1 and result.stopped == "out of budget" and set(calls) == {3}
    assert result.choice is not None and result.choice.is_strict  # nothing relaxed is certified on 3 samples


def test_race_rejects_bad_schedules():
    with pytest.raises(ValueError, match="increasing"):
        race([Config("strict", (), 2)], None, 0.02, lambda c: True, sizes=(5, 3), caps=(1,))
    with pytest.raises(ValueError, match="cap"):
        race([Config("strict", (), 2)], None, 0.02, lambda c: True, sizes=(3, 5), caps=())


def test_between_is_log_spaced_on_wide_grids():
    assert between([0.1, 0.25, 1.0, 10.0]) == [0.1, 0.1581, 0.25, 0.5, 1.0, 3.162, 10.0]
    assert between([0.3, 0.7, 0.95]) == [0.3, 0.5, 0.7, 0.825, 0.95]


def test_search_space_has_strict_at_each_n_and_every_rule_between_its_grid():
    space = search_space(None, [2, 3])
    assert space[:2] == [make_config("strict", {}, 2), make_config("strict", {}, 3)]
    cactus = sorted(c.params_dict["delta"] for c in space if c.method == "cactus" and c.draft_length == 2)
    assert cactus == [0.1, 0.1581, 0.25, 0.5, 1.0, 3.162, 10.0]
    assert not any(c.method == "pad" for c in space)
    assert {c.method for c in space} >= {"mentored", "fuzzy", "r-fuzzy", "spec-casc-opt", "spec-casc-tok",
                                         "ensemble", "spec-cont-dec", "typical"}
    only = search_space(["cactus:delta=0.5/2"], [4])
    assert [c.label for c in only] == ["strict N=4", "cactus(delta=0.5) N=4", "cactus(delta=2) N=4"]
    with pytest.raises(ValueError, match="unknown method"):
        search_space(["nope"], [2])
