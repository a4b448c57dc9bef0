"""The method grammar and what a rule declares a round costs.

A method is AR or an acceptance rule with its parameters. `parse_method` reads one item of a `methods` setting:
'NAME' (the rule's paper grid) or 'NAME:PARAM=V1/V2[;PARAM=V...]' (the product of the values given); the default
grid (`default_methods`) is AR and every rule at its paper grid. A rule's declarations price its rounds: the pivot
classifier it reads (`needs_classifier`, `classifier_cost`) and the drafter passes beyond N (`extra_draft_passes`).
"""

from __future__ import annotations

import itertools
import json

from relaxspec.bench.names import AR

DEFAULT_PAD_THRESHOLDS = (0.3, 0.5, 0.7)
CLASSIFIER_INPUT = "pivot_prob"  # a rule with this tensor input needs a pivot classifier (pivot_fn)

# what the layers above use (relaxspec.bench.methods)
__all__ = ["parse_method", "needs_classifier", "classifier_cost", "extra_draft_passes"]


def _rules():
    from relaxspec.acceptance import RULES
    return RULES


def needs_classifier(method: str) -> bool:
    """Whether the rule reads a pivot classifier's output (it declares the tensor input)."""
    rule = _rules().get(method)  # AR and an unknown name (refused elsewhere, with the known ones) read none
    return rule is not None and CLASSIFIER_INPUT in rule.inputs


def classifier_cost(method: str, c_pivot: float | None) -> float:
    """What a round of `method` pays for the pivot classifier, in verifier steps: the measured c_pivot (None: not
    measured, 0) for a rule that reads one, 0 for the others (the speed constants store c_pivot per (verifier,
    drafter, N), which cells of other rules share)."""
    return (c_pivot or 0.0) if needs_classifier(method) else 0.0


def extra_draft_passes(method: str) -> int:
    """Drafter forward passes a round of this rule costs beyond N, as the rule declares (AR: 0)."""
    return 0 if method == AR else int(_rules()[method].extra_draft_passes)


def _paper_points(name: str, pad_thresholds) -> list[dict]:
    """The rule's paper grid: the product of each parameter's grid (parameters without one stay default).
    A rule that needs a classifier is run at `pad_thresholds`."""
    rule = _rules()[name]
    if needs_classifier(name):
        return [{"threshold": float(t)} for t in pad_thresholds]
    axes = [(p, list(spec.grid)) for p, spec in rule.params.items() if spec.grid]
    if not axes:
        return [{}]
    return [dict(zip([a for a, _ in axes], combo)) for combo in itertools.product(*[v for _, v in axes])]


def default_methods(pad_thresholds=DEFAULT_PAD_THRESHOLDS) -> list[tuple[str, dict]]:
    """AR; every rule at each point of its paper grid (in the registry's order, strict first; classifier
    rules last, at `pad_thresholds`)."""
    rules = sorted(_rules(), key=needs_classifier)
    out = [(AR, {})]
    for name in rules:
        out.extend((name, p) for p in _paper_points(name, pad_thresholds))
    return _unique(out)


def method_specs(items: list[str] | None, pad_thresholds=DEFAULT_PAD_THRESHOLDS) -> list[tuple[str, dict]]:
    """The (method, params) points of a `methods` setting (None: the default grid), each once."""
    if items is None:
        return default_methods(pad_thresholds)
    out = []
    for item in items:
        out.extend(parse_method(item, pad_thresholds))
    return _unique(out)


def _unique(specs: list[tuple[str, dict]]) -> list[tuple[str, dict]]:
    seen, unique = set(), []
    for name, params in specs:
        sig = (name, json.dumps(params, sort_keys=True))
        if sig not in seen:
            seen.add(sig)
            unique.append((name, params))
    return unique


def parse_method(item: str, pad_thresholds=DEFAULT_PAD_THRESHOLDS) -> list[tuple[str, dict]]:
    """'NAME' (its paper grid), or 'NAME:PARAM=V1/V2[;PARAM=V...]' (the product of the values given;
    parameters not given stay at the rule's default)."""
    item = item.strip()
    name, _, rest = item.partition(":")
    name = name.strip()
    rules = _rules()
    if name == AR:
        if rest:
            raise ValueError(f"method 'ar' takes no parameters, got {rest!r}")
        return [(AR, {})]
    if name not in rules:
        raise ValueError(f"unknown method {name!r}; known: ar, {', '.join(rules)}")
    if not rest:
        return [(name, p) for p in _paper_points(name, pad_thresholds)]
    rule = rules[name]
    axes = []
    for part in rest.split(";"):
        pname, eq, values = part.partition("=")
        pname = pname.strip()
        if not eq or not values.strip():
            raise ValueError(f"method {item!r}: expected PARAM=VALUE[/VALUE...], got {part!r}")
        if pname not in rule.params:
            raise ValueError(f"method {item!r}: rule {name!r} has no parameter {pname!r}; "
                             f"it has: {', '.join(rule.params) or 'none'}")
        try:
            vals = [float(v) for v in values.split("/")]
        except ValueError:
            raise ValueError(f"method {item!r}: values of {pname!r} must be numbers, got {values!r}") from None
        axes.append((pname, vals))
    points = [(name, dict(zip([a for a, _ in axes], combo))) for combo in itertools.product(*[v for _, v in axes])]
    for pname, vals in axes:  # out-of-range values fail here, before any work (not in every cell)
        for v in vals:
            try:
                rule.params[pname].check(v, name)
            except ValueError as e:
                raise ValueError(f"method {item!r}: {e}") from None
    return points
