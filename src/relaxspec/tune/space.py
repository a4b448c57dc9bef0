"""The search space of `relaxspec tune`: strict at each draft length N, and every other rule over a range of
strengths at each N (N: 2..10 and "auto", the engine's per-sequence +2/-1 schedule).

A rule's strengths are its paper grid plus the point between each two neighbours: the geometric mean when the
grid is positive and spans a factor of 10 or more (e.g. CACTUS delta 0.1 .. 10, log-spaced), the arithmetic
mean otherwise. A rule with several gridded parameters (typical) is run at the product of its paper grids.
Rules that need a pivot classifier (PAD) enter only when one fits the pair (the caller says so). At temperature 0
a point enters only where it can emit other tokens than strict's, once for the points that emit the same tokens
(each rule's `greedy_point`): strict's tokens there are AR greedy's.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field

from relaxspec.bench import methods as bench_methods  # (`methods`: search_space's argument)
from relaxspec.names import AR, AUTO, STRICT, method_label

DEFAULT_DRAFT_LENGTHS = (*range(2, 11), AUTO)
PAD_THRESHOLDS = (0.1, 0.3, 0.5, 0.7, 0.9)


@dataclass(frozen=True)
class Config:
    """One point of the search space: a rule, its parameters (sorted items) and the draft length N."""
    method: str
    params: tuple = field(default=())
    draft_length: int | str = 0  # "auto": the engine's schedule

    @property
    def params_dict(self) -> dict:
        return dict(self.params)

    @property
    def is_strict(self) -> bool:
        return self.method == STRICT

    @property
    def strict(self) -> "Config":
        """Strict at the same N: the coupled reference of this configuration."""
        return Config(STRICT, (), self.draft_length)

    @property
    def label(self) -> str:
        return f"{method_label(self.method, self.params_dict)} N={self.draft_length}"

    @property
    def method_spec(self) -> str:
        """The bench's method grammar: NAME or NAME:PARAM=V;PARAM=V."""
        if not self.params:
            return self.method
        return self.method + ":" + ";".join(f"{k}={v!r}" for k, v in self.params)


def make_config(method: str, params: dict, draft_length: int) -> Config:
    return Config(method, tuple(sorted((k, float(v)) for k, v in params.items())),
                  draft_length if draft_length == AUTO else int(draft_length))


def _round(x: float) -> float:
    return float(f"{x:.4g}")


def between(grid) -> list[float]:
    """The grid plus the point between each two neighbours (geometric on a wide positive grid)."""
    values = sorted(set(float(v) for v in grid))
    log = len(values) > 1 and values[0] > 0 and values[-1] / values[0] >= 10
    out = [values[0]] if values else []
    for a, b in zip(values, values[1:]):
        out += [_round(math.sqrt(a * b) if log else (a + b) / 2), b]
    return out


def strength_points(name: str) -> list[dict]:
    """Parameter points of one rule (see the module doc); [{}] for a rule without a gridded parameter."""
    from relaxspec.acceptance import RULES
    if bench_methods.needs_classifier(name):
        return [{"threshold": t} for t in PAD_THRESHOLDS]
    rule = RULES[name]
    axes = [(p, list(spec.grid)) for p, spec in rule.params.items() if spec.grid]
    if not axes:
        return [{}]
    if len(axes) == 1:
        return [{axes[0][0]: v} for v in between(axes[0][1])]
    return [dict(zip([a for a, _ in axes], combo)) for combo in itertools.product(*[v for _, v in axes])]


def default_rules(with_classifier: bool) -> list[str]:
    from relaxspec.acceptance import RULES
    return [name for name in RULES if with_classifier or not bench_methods.needs_classifier(name)]


def search_space(methods: list[str] | None, draft_lengths=DEFAULT_DRAFT_LENGTHS,
                 with_classifier: bool = False, greedy: bool = False) -> list[Config]:
    """Strict at each N first, then every (rule, strength) at each N. `methods`: rule names (their range as
    above) or the bench grammar NAME:PARAM=V1/V2 (exactly those points); None: every rule (PAD only when
    `with_classifier`). 'ar' and 'strict' in `methods` are ignored: strict is always searched, AR is the
    speed baseline. `greedy` (temperature 0): each point as its rule's `greedy_point`, those strict there left out."""
    if not draft_lengths:
        raise ValueError("tune: draft lengths must not be empty")
    for n in draft_lengths:
        if n != AUTO and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
            raise ValueError(f"tune: draft lengths must be integers >= 1 or {AUTO!r}, got {n!r}")
    points: list[tuple[str, dict]] = []
    for item in (default_rules(with_classifier) if methods is None else methods):
        name = item.split(":", 1)[0].strip()
        if name in (AR, STRICT):
            continue
        if ":" in item:
            points += bench_methods.parse_method(item)
        else:
            bench_methods.parse_method(name)  # raises on an unknown rule
            points += [(name, p) for p in strength_points(name)]
    if greedy:
        from relaxspec.acceptance import get_rule
        points = [(m, q) for m, q in ((m, get_rule(m).greedy_point(p)) for m, p in points) if q is not None]
    configs = [make_config(STRICT, {}, n) for n in draft_lengths]
    configs += [make_config(m, p, n) for n in draft_lengths for m, p in points]
    return list(dict.fromkeys(configs))
