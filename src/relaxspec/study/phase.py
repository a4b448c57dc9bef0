"""`report --findings`' line on phase-aware relaxation (issue 28): does relaxing only a span of the response (a
bench run with `--phase`, e.g. the task's worked steps) keep utility closer to strict than relaxing everywhere, at
the same acceptance length?

It pairs the report's settings group with the stored group whose settings differ only in `phase`: each relaxed
cell run with a phase against the cell of the same drafter, task, N, seed and rule run without one whose mean
acceptance length (with bonus) is closest, if within MATCH_TAU of it; each pair's coupled paired interval of the
utility difference (the same samples' seeds) says better (above 0), worse (below 0), equivalent (within
+-budget) or undecided. Confirmed when the phase runs are better in more pairs than worse and in at least a
quarter of them, counting the undecided pairs both ways (as the other findings).
"""

from __future__ import annotations

import json

from relaxspec.bench.metrics import compare
from relaxspec.bench.names import method_label
from relaxspec.study.findings import (Finding, _both_ways, _ci, _f, _label, _relaxed, majority_verdict, matched_kind,
                                      simultaneous)

MATCH_TAU = 0.05  # acceptance lengths within 5% of each other count as the same


def _same_but_phase(a: dict, b: dict) -> bool:
    return all(a.get(k) == b.get(k) for k in set(a) | set(b) if k != "phase")


def finding_phase(store, rows: list[dict], looks: int, max_drop: float) -> Finding:
    from relaxspec.bench.report import build_rows
    f = Finding("phase", "relaxing only a span (phase-aware) keeps utility closer to strict than relaxing everywhere "
                         "at the same acceptance length",
                f"each relaxed cell run with a phase vs the same drafter, task, N and rule run without one at the "
                f"closest mean acceptance length (within {MATCH_TAU:.0%}), coupled paired interval of the utility "
                "difference: phase better in more pairs than worse, and in at least a quarter of them")
    current = rows[0]["settings"]
    cells = [r for r in build_rows(store, "all") if _relaxed(r) and _same_but_phase(r["settings"], current)]
    with_phase = [r for r in cells if r["settings"].get("phase")]
    without = [r for r in cells if not r["settings"].get("phase")]
    pairs = []
    for p in with_phase:
        same = [r for r in without if (r["drafter"], r["task"], r["draft_length"], r["seed"], r["method"]) ==
                (p["drafter"], p["task"], p["draft_length"], p["seed"], p["method"])]
        tau = p["mean_acceptance_length"]
        near = [r for r in same if abs(r["mean_acceptance_length"] / tau - 1) <= MATCH_TAU]
        if near:
            pairs.append((p, min(near, key=lambda r: abs(r["mean_acceptance_length"] - tau))))
    # one test: the pairs' intervals are simultaneous (Bonferroni over them and the bench's looks)
    f.intervals, f.confidence = len(pairs), simultaneous(looks, len(pairs))
    found = {"better": [], "worse": [], "equivalent": [], "undecided": []}
    for p, r in pairs:
        i = compare(store.utilities(p["key"]), store.utilities(r["key"]), f.confidence)
        found[matched_kind(i, max_drop)].append((p, r, i))
    total = sum(len(v) for v in found.values())
    if not total:
        f.verdict, f.reason = _both_ways(False, False, "cells run with a phase (`bench --phase task` with these "
                                                       "settings) at an acceptance length of cells run without one")
        return f
    phases = sorted({p["settings"]["phase"] for p in with_phase})
    f.evidence.append(f"{total} matched pairs (phase {', '.join(map(repr, phases))}): phase " +
                      ", ".join(f"{k} in {len(v)}" for k, v in found.items()))
    for p, r, i in (found["better"] + found["worse"] + found["undecided"])[:4]:
        f.evidence.append(f"  {_label(p)} (tau {_f(p['mean_acceptance_length'])}) - "
                          f"{method_label(r['method'], json.loads(r['params']))} everywhere "
                          f"(tau {_f(r['mean_acceptance_length'])}): {_ci(i)}")
    f.verdict, f.reason = majority_verdict(found)
    return f
