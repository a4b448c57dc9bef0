"""Racing / successive halving under a utility budget: pure logic, no model.

Problem: among configurations c (strict at each N is among them), maximise the objective speed(c) subject to
drop(c) = utility(strict at c's N) - utility(c) <= max_drop, where drop is estimated from paired (coupled)
samples and its upper 95% bound must be within the budget.

Design (sizes n_0 < n_1 < ... < n_{R-1} samples per configuration, a cap on how many go on after each rung):
at rung r every live configuration is brought to n_r samples (`evaluate(config, n)`; its strict reference at
the same N comes with it), then
1. clearly lossy: the Bonferroni interval of its difference vs strict (confidence 1 - alpha / (2 R K), K the
   number of configurations: alpha is shared by the R K lossy and the R K slower tests) lies wholly beyond
   -max_drop  -> dropped;
2. clearly slower: the Bonferroni interval of its speed lies wholly below the Bonferroni lower bound of the
   best configuration known feasible (strict at any N, or one whose Bonferroni difference interval lies
   wholly within the budget)  -> dropped;
3. halving (not the last rung): the survivors are ranked, point-feasible first (difference point estimate
   >= -max_drop, or strict), then by speed point estimate; the first caps[r] go on, and the fastest strict
   with them if none is among them (the lossless fallback the answer must beat). The strict reference of a
   live configuration is sampled with it anyway, so it rejoins the race at no cost.
With probability >= 1 - alpha, every drop of kinds 1 and 2 is right (a union bound over at most 2 R K tests,
as far as the intervals hold their level; a drop of kind 2 also needs the best's lower bound to hold, which is
one of the same tests). The intervals are the arms': clustered by prompt and valid at the first rung's size
(tune's arms: bench.stats' score intervals, Fieller's interval for the speed ratio with a t quantile; at
least 2 prompts). Halving is the budget heuristic, whose loss is measured by the synthetic tests
(tests/tune/test_tune_racing.py: nested samples, estimated variances, lossy configurations just beyond the budget),
not bounded.
Choice: among the configurations of the last rung reached, those whose 95% difference interval lies within
the budget (upper 95% bound of the drop <= max_drop; strict always), the highest speed point estimate.
The winner's curse of that maximum is what the held-out confirmation checks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Hashable, Protocol

from relaxspec.bench import stats

ALPHA = 0.05
DEFAULT_SIZES = (6, 24, 72, 240)
DEFAULT_CAPS = (64, 16, 4)

LOSSY, SLOWER, HALVED = "clearly lossy", "clearly slower", "halving"


class Arm(Protocol):
    """What the race knows of a configuration after sampling it."""

    def diff(self, confidence: float) -> stats.Interval:
        """Utility minus strict's at the same N, paired; strict itself: exactly 0."""

    def speed(self, confidence: float) -> stats.Interval:
        """The objective, with its interval."""


@dataclass
class Record:
    config: Hashable
    samples: int = 0
    rung: int = -1  # last rung reached
    diff: stats.Interval | None = None  # at 1 - alpha, after its last rung
    speed: stats.Interval | None = None
    dropped: str | None = None  # LOSSY / SLOWER / HALVED, None while alive
    feasible: bool = False  # 95% difference interval within the budget at its last rung (strict: True)


@dataclass
class Race:
    records: dict  # config -> Record, in the order given
    rungs_run: int = 0
    stopped: str = ""  # why the race ended: "all rungs", "out of budget", "nothing left"
    choice: Hashable | None = None
    bonferroni: float = 0.0  # the confidence of the drop decisions

    @property
    def finalists(self) -> list:
        return [c for c, r in self.records.items() if r.dropped is None and r.rung == self.rungs_run - 1]


def default_caps(sizes) -> tuple:
    """One cap per rung but the last: DEFAULT_CAPS's first ones, its last repeated beyond them."""
    return tuple(DEFAULT_CAPS[min(i, len(DEFAULT_CAPS) - 1)] for i in range(len(sizes) - 1))


def validate_schedule(sizes, caps) -> None:
    if not sizes or any(not isinstance(n, int) or n < 1 for n in sizes) or list(sizes) != sorted(set(sizes)):
        raise ValueError(f"tune: rung sizes must be increasing positive integers, got {list(sizes)}")
    if len(caps) != len(sizes) - 1 or any(not isinstance(k, int) or k < 1 for k in caps):
        raise ValueError(f"tune: need one positive cap per rung but the last ({len(sizes) - 1}), got {list(caps)}")


def race(configs: list, evaluate: Callable[[Hashable, int], Arm], max_drop: float,
         is_reference: Callable[[Hashable], bool], sizes=DEFAULT_SIZES, caps=DEFAULT_CAPS, alpha: float = ALPHA,
         fits: Callable[[list, int], bool] = lambda alive, n: True,
         on_rung: Callable[[int, list], None] | None = None,
         reference_of: Callable[[Hashable], Hashable | None] = lambda c: None,
         prefetch: Callable[[list, int], None] | None = None) -> Race:
    """Run the race (see the module doc). `fits(alive, n)` says whether the next rung fits the budget (the
    first rung always runs); `on_rung(rung, alive)` is called after each rung's decisions; `reference_of(c)`
    names the reference c is compared with (strict at its N), which `evaluate` samples with c: it rejoins the
    race whenever c is alive, at no cost. `prefetch(alive, n)`, if given, is called before each rung's
    evaluations (e.g. to run all their samples at once on an executor)."""
    validate_schedule(sizes, caps)
    if not configs:
        raise ValueError("tune: nothing to search")
    if not 0 <= max_drop < 1:
        raise ValueError(f"tune: max drop must lie in [0, 1), got {max_drop}")
    plain = 1 - alpha
    strong = 1 - alpha / (2 * len(sizes) * len(configs))  # one alpha for every lossy and slower drop
    result = Race(records={c: Record(c) for c in configs}, bonferroni=strong, stopped="all rungs")
    alive = list(configs)
    arms: dict = {}
    for rung, n in enumerate(sizes):
        if rung > 0 and not fits(alive, n):
            result.stopped = "out of budget"
            break
        for c in list(alive):  # a live configuration's reference is sampled with it anyway: it stays a candidate
            ref = reference_of(c)
            if ref is not None and ref in result.records and ref not in alive:
                result.records[ref].dropped = None
                alive.append(ref)
        if prefetch is not None:
            prefetch(alive, n)
        arms = {c: evaluate(c, n) for c in alive}
        result.rungs_run = rung + 1
        for c in alive:
            rec = result.records[c]
            rec.samples, rec.rung = n, rung
            rec.diff, rec.speed = arms[c].diff(plain), arms[c].speed(plain)
            rec.feasible = is_reference(c) or rec.diff.low >= -max_drop
        known = [arms[c].speed(strong).low for c in alive
                 if is_reference(c) or arms[c].diff(strong).low >= -max_drop]
        bar = max([x for x in known if not math.isnan(x)], default=-math.inf)
        for c in alive:
            if not is_reference(c) and arms[c].diff(strong).high < -max_drop:
                result.records[c].dropped = LOSSY
            elif arms[c].speed(strong).high < bar:
                result.records[c].dropped = SLOWER
        alive = [c for c in alive if result.records[c].dropped is None]
        if rung < len(sizes) - 1:
            ranked = sorted(alive, key=lambda c: (not _point_feasible(result.records[c], is_reference(c), max_drop),
                                                  -_finite(result.records[c].speed.mean)))
            keep = ranked[:caps[rung]]
            references = [c for c in ranked if is_reference(c)]
            if references and not any(is_reference(c) for c in keep):  # the lossless fallback stays in
                keep.append(references[0])
            for c in ranked:
                if c not in keep:
                    result.records[c].dropped = HALVED
            alive = keep
        if on_rung is not None:
            on_rung(rung, alive)
        if not alive:
            result.stopped = "nothing left"
            break
    feasible = [c for c in alive if result.records[c].feasible and c in arms]
    if feasible:
        result.choice = max(feasible, key=lambda c: _finite(result.records[c].speed.mean))
    return result


def _point_feasible(rec: Record, reference: bool, max_drop: float) -> bool:
    return reference or rec.diff.mean >= -max_drop


def _finite(x: float) -> float:
    return -math.inf if math.isnan(x) else x
