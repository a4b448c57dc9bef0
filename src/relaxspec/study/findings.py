"""`relaxspec report DIR --findings`: the seed investigation's findings, checked on a stored bench run.

Every verdict is read from the stored cells of one settings group (the latest, as the report) and the bench's
own statistics: each relaxed cell's coupled paired interval of (utility - strict's) at the same verifier,
drafter, task, N and seed (Tango, at the bench's decision confidence), its state against the budget `max_drop`
(within: the interval's lower end >= -max_drop; beyond: its upper end < -max_drop; otherwise undecided), and
its length-adjusted modelled speed-up S (at the pair's measured c_rel, or at a fixed c_rel). Nothing is re-run.

Rules are grouped by what they declare (relaxspec.acceptance.Rule), never by name:
* trusting q: `trusts_q` (can accept a draft the verifier gives probability 0): ensemble, fuzzy, r-fuzzy,
  spec-casc-opt;
* verifier-bounded: reads q, does not trust it, only loosens strict's test (`accepts_at_least_strict`) and needs
  no classifier: CACTUS, mentored;
* training-free: every relaxed rule that needs no classifier; PAD: the rules that read a pivot classifier.
Drafters by kind: the MTP drafter is an MTP head (relaxspec.models.family.is_mtp); among the LM drafters the strong
one agrees most with the verifier (highest acceptance rate under strict, over the run's cells) and the weak one
least. A strength order within a rule's settings: the measured acceptance rate (the more a setting accepts,
the stronger the relaxation), which needs no knowledge of the parameter.

Each verdict is the finding's test evaluated twice, once with the undecided cells counted against the finding
and once in its favour: confirmed when it holds both ways, not confirmed when it fails both ways, inconclusive
otherwise (the undecided cells decide it; more samples would), or when the evidence it needs is missing.
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass, field

from relaxspec.bench.metrics import BEYOND, NO_STRICT, WITHIN, compare
from relaxspec.bench.names import AR, FINDINGS_MAX_DROP, STRICT, method_label
from relaxspec.bench.speedup import C_REL_GRID
from relaxspec.bench.stats import Interval

CONFIRMED, NOT_CONFIRMED, INCONCLUSIVE = "confirmed", "not confirmed", "inconclusive"
SHARE_LOSES = 0.5  # (2) "loses utility": at least this share of the group's cells beyond the budget
SHARE_CLOSE = 0.25  # (2) "stays close": at most this share beyond the budget
SHARE_LONGER = 0.25  # (4) at least this share of the weak drafter's relaxed cells significantly longer
LENGTH_MARGIN = 0.05  # (4) "not longer": the length difference's upper end <= 5% of max_new_tokens
SPEED_GAIN = 1.05  # (3) a relaxed speed-up: at least 5% above strict's best over N
COMPARABLE = 0.9  # (5) strict's best over N reaches 90% of the best eligible speed-up; (6) transfer within 95%
TRANSFER = 0.95
MATCH = 0.1  # PAD: training-free cells whose S lies within 10% of the PAD cell's


@dataclass
class Finding:
    key: str
    claim: str
    rule: str
    verdict: str = INCONCLUSIVE
    reason: str = ""
    evidence: list[str] = field(default_factory=list)


def speed_column(c_rel: float | None) -> str:
    """The length-adjusted modelled speed-up column of the report rows: at the measured c_rel (None) or at one
    of the grid's values."""
    if c_rel is None:
        return "length_adjusted_speedup_measured_c_rel"
    if c_rel not in C_REL_GRID:
        raise ValueError(f"--c-rel must be one of {', '.join(f'{c:g}' for c in C_REL_GRID)} (the bench's grid), "
                         f"got {c_rel:g}")
    return f"length_adjusted_speedup_c{c_rel:g}"


def _plain_column(column: str) -> str:
    return column.replace("length_adjusted_speedup_", "modelled_speedup_")


# ---------------------------------------------------------------- rule and drafter groups (declarations)

def _rules():
    from relaxspec.acceptance import RULES
    return RULES


def is_classifier_rule(method: str) -> bool:
    from relaxspec.bench.config import needs_classifier
    return needs_classifier(method)


def trusts_q(method: str) -> bool:
    return _rules()[method].trusts_q


def verifier_bounded(method: str) -> bool:
    rule = _rules()[method]
    return rule.reads_q and not rule.trusts_q and rule.accepts_at_least_strict and not is_classifier_rule(method)


def _relaxed(r: dict) -> bool:
    return r["method"] not in (AR, STRICT)


def _training_free(r: dict) -> bool:
    return _relaxed(r) and not is_classifier_rule(r["method"])


def drafter_roles(rows: list[dict]) -> dict:
    """{'mtp': name or None, 'strong': name or None, 'weak': name or None} (see the module doc); strong and weak
    need two LM drafters."""
    from relaxspec.models.family import is_mtp
    drafters = sorted({r["drafter"] for r in rows if r["drafter"]})
    mtp = [d for d in drafters if is_mtp(d)]
    agreement = {d: statistics.fmean(r["acceptance_rate"] for r in rows if r["drafter"] == d
                                     and r["method"] == STRICT)
                 for d in drafters if d not in mtp and any(r["drafter"] == d and r["method"] == STRICT for r in rows)}
    ranked = sorted(agreement, key=agreement.get)
    return {"mtp": mtp[0] if mtp else None, "strong": ranked[-1] if len(ranked) >= 2 else None,
            "weak": ranked[0] if len(ranked) >= 2 else None, "agreement": agreement}


# ---------------------------------------------------------------- helpers

def _state(r: dict) -> str:
    """within / beyond / undecided against the budget (the report's decisions, with_decisions)."""
    d = r["vs_strict_decision"]
    return d if d in (WITHIN, BEYOND, NO_STRICT) else "undecided"


def _label(r: dict) -> str:
    n = f" N={r['draft_length']}" if r["draft_length"] else ""
    return f"{r['task']} / {r['drafter']} {method_label(r['method'], json.loads(r['params']))}{n}"


def _ci(i: Interval | None) -> str:
    if i is None or math.isnan(i.mean):
        return "-"
    return f"{i.mean:+.3f} [{i.low:+.3f}, {i.high:+.3f}]"


def _diff(r: dict) -> str:
    return f"{_ci(r['vs_strict'])} vs strict ({_state(r)})"


def _both_ways(against: bool, favour: bool, missing: str = "") -> tuple[str, str]:
    if missing:
        return INCONCLUSIVE, f"missing {missing}"
    if against:
        return CONFIRMED, "holds even with every undecided cell counted against it"
    if not favour:
        return NOT_CONFIRMED, "fails even with every undecided cell counted in its favour"
    return INCONCLUSIVE, "the undecided cells decide it (more samples would)"


def _count(rows: list[dict]) -> dict:
    states = [_state(r) for r in rows]
    return {s: states.count(s) for s in (WITHIN, BEYOND, "undecided")}


def _fmt_count(c: dict, total: int) -> str:
    return f"{c[BEYOND]} of {total} beyond, {c[WITHIN]} within, {c['undecided']} undecided"


def _s(r: dict | None, column: str) -> float:
    return math.nan if r is None else r[column]


def _f(x: float, places: int = 2) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{places}f}"


# ---------------------------------------------------------------- the findings

def finding_capability(store, rows: list[dict], confidence: float) -> Finding:
    f = Finding("1", "relaxation needs capability evaluation: utility moves with the rule's strength",
                "(a) in some family (rule, drafter, task, N; its settings ordered by measured acceptance rate) the "
                "strongest setting's utility is below the weakest's (coupled paired interval of their difference "
                "wholly below 0), and (b) the run has relaxed cells both within the budget and beyond it (which "
                "relaxations are safe is only known by measuring)")
    families: dict[tuple, list] = {}
    for r in rows:
        if _training_free(r):
            families.setdefault((r["method"], r["drafter"], r["task"], r["draft_length"], r["seed"]), []).append(r)
    moves = []
    for cells in families.values():
        if len(cells) >= 2:
            weakest, strongest = min(cells, key=lambda r: r["acceptance_rate"]), max(cells, key=lambda r: r["acceptance_rate"])
            moves.append((weakest, strongest, compare(store.utilities(strongest["key"]), store.utilities(weakest["key"]),
                                                      confidence)))
    relaxed = [r for r in rows if _training_free(r) and _state(r) != NO_STRICT]
    c = _count(relaxed)
    f.evidence.append(f"training-free relaxed cells vs strict: {_fmt_count(c, len(relaxed))}")
    dropping = [m for m in moves if m[2].high < 0]
    f.evidence.append(f"{len(dropping)} of {len(moves)} families lose utility from their weakest to their strongest "
                      f"setting; {sum(m[2].low < 0 for m in moves)} could")
    for weak, strong, i in sorted(dropping, key=lambda m: m[2].mean)[:4]:
        f.evidence.append(f"  {_label(weak)} -> {method_label(strong['method'], json.loads(strong['params']))}: "
                          f"{_ci(i)} (vs strict {weak['utility_diff_vs_strict']:+.3f} -> "
                          f"{strong['utility_diff_vs_strict']:+.3f})")
    if not moves or not relaxed:
        f.verdict, f.reason = _both_ways(False, False, "relaxed cells with a strict reference (two settings of a rule)")
        return f
    against = bool(dropping) and c[WITHIN] > 0 and c[BEYOND] > 0
    favour = any(m[2].low < 0 for m in moves) and c[WITHIN] + c["undecided"] > 0 and c[BEYOND] + c["undecided"] > 0
    f.verdict, f.reason = _both_ways(against, favour)
    return f


def _group_shares(rows: list[dict], drafter: str) -> tuple[list, list]:
    mine = [r for r in rows if r["drafter"] == drafter and _training_free(r) and _state(r) != NO_STRICT]
    return [r for r in mine if trusts_q(r["method"])], [r for r in mine if verifier_bounded(r["method"])]


def finding_mtp(rows: list[dict], roles: dict) -> Finding:
    f = Finding("2", "with the MTP drafter, rules that trust q lose utility while CACTUS and mentored stay close",
                f"MTP drafter: >= {SHARE_LOSES:.0%} of the q-trusting rules' cells (declared trusts_q) beyond the "
                f"budget, and <= {SHARE_CLOSE:.0%} of the verifier-bounded rules' cells (reads q, no trust, "
                "accepts at least as strict) beyond it")
    mtp = roles["mtp"]
    if mtp is None:
        f.verdict, f.reason = _both_ways(False, False, "an MTP drafter in this run")
        return f
    trusting, bounded = _group_shares(rows, mtp)
    if not trusting or not bounded:
        f.verdict, f.reason = _both_ways(False, False, "q-trusting or verifier-bounded cells with the MTP drafter")
        return f
    ct, cb = _count(trusting), _count(bounded)
    for name, group, c in (("q-trusting", trusting, ct), ("verifier-bounded", bounded, cb)):
        rules = ", ".join(sorted({r["method"] for r in group}))
        f.evidence.append(f"{mtp}, {name} ({rules}): {_fmt_count(c, len(group))}; mean difference vs strict "
                          f"{statistics.fmean(r['utility_diff_vs_strict'] for r in group):+.3f}")
    for d in sorted({r["drafter"] for r in rows if r["drafter"] and r["drafter"] != mtp}):
        t, b = _group_shares(rows, d)
        if t and b:
            f.evidence.append(f"  for contrast, {d}: q-trusting {_fmt_count(_count(t), len(t))}; "
                              f"verifier-bounded {_fmt_count(_count(b), len(b))}")

    def holds(trust_beyond: int, bound_beyond: int) -> bool:
        return trust_beyond >= SHARE_LOSES * len(trusting) and bound_beyond <= SHARE_CLOSE * len(bounded)

    f.verdict, f.reason = _both_ways(holds(ct[BEYOND], cb[BEYOND] + cb["undecided"]),
                                     holds(ct[BEYOND] + ct["undecided"], cb[BEYOND]))
    return f


def _best(cells: list[dict], column: str, eligible) -> dict | None:
    ok = [r for r in cells if (r["method"] == STRICT or (_relaxed(r) and eligible(r))) and not math.isnan(r[column])]
    return max(ok, key=lambda r: r[column], default=None)


def _within(r: dict) -> bool:
    return _state(r) == WITHIN


def _not_beyond(r: dict) -> bool:
    return _state(r) in (WITHIN, "undecided")


def _speculative(rows: list[dict], drafter: str, task: str) -> list[dict]:
    return [r for r in rows if r["drafter"] == drafter and r["task"] == task and r["method"] != AR]


def _tasks(rows: list[dict]) -> list[str]:
    return sorted({r["task"] for r in rows})


def finding_strong(rows: list[dict], roles: dict, column: str) -> Finding:
    f = Finding("3", "a strong drafter gives near-lossless relaxed speed-ups, at a higher c_rel",
                f"strong LM drafter, on every task: the best relaxed cell within the budget has S >= {SPEED_GAIN:g} x "
                "strict's best S over N; and its measured c_rel is above the MTP drafter's")
    strong, mtp = roles["strong"], roles["mtp"]
    missing = "two LM drafters (strong and weak)" if strong is None else "an MTP drafter" if mtp is None else ""
    if missing:
        f.verdict, f.reason = _both_ways(False, False, missing)
        return f
    c_rel = {d: statistics.fmean(r["c_rel_measured"] for r in rows if r["drafter"] == d and r["method"] == STRICT)
             for d in (strong, mtp)}
    higher = c_rel[strong] > c_rel[mtp]
    f.evidence.append(f"measured c_rel: {strong} {c_rel[strong]:.3f}, {mtp} {c_rel[mtp]:.3f} (higher: {higher}; as "
                      "`models list` measures them: an LM's one-token step, a head's time per drafted token through "
                      "the drafter protocol, over the verifier's step)")
    gains = {True: [], False: []}  # undecided cells eligible?
    for task in _tasks(rows):
        cells = _speculative(rows, strong, task)
        strict = _best([r for r in cells if r["method"] == STRICT], column, _within)
        for lenient, eligible in ((False, _within), (True, _not_beyond)):
            best = _best([r for r in cells if _training_free(r)], column, eligible)
            gains[lenient].append(_s(best, column) / _s(strict, column) if best and strict else math.nan)
        best = _best([r for r in cells if _training_free(r)], column, _within)
        f.evidence.append(f"{task}: strict's best {_f(_s(strict, column))}x (N={strict['draft_length'] if strict else '-'}); "
                          f"best relaxed within budget " + (f"{_label(best)} {_f(best[column])}x, {_diff(best)}"
                                                            if best else "none"))
    if not gains[True] or any(math.isnan(_s(_best([r for r in _speculative(rows, strong, t) if r["method"] == STRICT],
                                                    column, _within), column)) for t in _tasks(rows)):
        f.verdict, f.reason = _both_ways(False, False, "strict cells with a speed-up for the strong drafter")
        return f
    gain = lambda gs: ", ".join(_f(g, 3) for g in gs)  # noqa: E731  (3 places: the bar is 1.05)
    f.evidence.append(f"gain over strict's best: {gain(gains[False])} (needs >= {SPEED_GAIN} on every task; undecided "
                      f"counted in: {gain(gains[True])})")
    ok = lambda gs: all(g >= SPEED_GAIN for g in gs)  # noqa: E731  (NaN: no eligible relaxed cell, a failure)
    f.verdict, f.reason = _both_ways(higher and ok(gains[False]), higher and ok(gains[True]))
    return f


def finding_weak_lengths(store, rows: list[dict], roles: dict, column: str, confidence: float) -> Finding:
    f = Finding("4", "weak drafters under relaxation lengthen responses (length-adjusted speed-up below the plain one)",
                f"weak LM drafter: >= {SHARE_LONGER:.0%} of its relaxed cells give significantly longer responses "
                "than strict (paired interval of the length difference, as a share of max_new_tokens, above 0), "
                "at least twice as many as give significantly shorter ones (interval below 0); a cell whose "
                f"interval ends below +{LENGTH_MARGIN:g} is decided not longer")
    weak = roles["weak"]
    if weak is None:
        f.verdict, f.reason = _both_ways(False, False, "two LM drafters (strong and weak)")
        return f
    counts = {}
    for d in [weak] + [x for x in (roles["strong"], roles["mtp"]) if x]:
        longer, shorter, not_longer, undecided, ratios = length_changes(store, rows, d, confidence)
        counts[d] = (len(longer), len(shorter), len(undecided), len(longer) + len(not_longer) + len(undecided))
        ratio = statistics.fmean(ratios) if ratios else math.nan
        f.evidence.append(f"{d}: of {counts[d][3]} relaxed cells, {len(longer)} significantly longer than strict, "
                          f"{len(not_longer)} not longer ({len(shorter)} of them shorter), {len(undecided)} undecided; "
                          f"mean S_len / S {_f(ratio)}")
        if d == weak:
            for r, i in sorted(longer, key=lambda x: -x[1].mean)[:3]:
                f.evidence.append(f"  {_label(r)}: length {r['mean_response_length']:.0f} tokens, difference vs strict "
                                  f"{_ci(i)} of max_new_tokens; S {_f(r[_plain_column(column)])}, S_len {_f(r[column])}")
    n_long, n_short, n_und, total = counts[weak]
    if not total:
        f.verdict, f.reason = _both_ways(False, False, "relaxed cells with a strict reference for the weak drafter")
        return f

    def holds(longer: int) -> bool:
        return longer >= SHARE_LONGER * total and longer >= 2 * n_short and longer > 0

    f.verdict, f.reason = _both_ways(holds(n_long), holds(n_long + n_und))
    return f


def length_changes(store, rows: list[dict], drafter: str, confidence: float):
    """The drafter's training-free relaxed cells, by their response lengths against strict's at the same N (paired
    Tango interval of the difference of tokens / max_new_tokens): (longer: above 0, shorter: below 0, not longer:
    upper end <= LENGTH_MARGIN (shorter ones included), undecided: the rest), each as (row, interval); and each
    cell's S_len / S (= L_AR / L_method)."""
    strict = {(r["task"], r["draft_length"], r["seed"]): r for r in rows if r["drafter"] == drafter
              and r["method"] == STRICT}
    longer, shorter, not_longer, undecided, ratios = [], [], [], [], []
    for r in rows:
        ref = strict.get((r["task"], r["draft_length"], r["seed"]))
        if r["drafter"] != drafter or not _training_free(r) or ref is None:
            continue
        scale = float(r["max_new_tokens"])
        lengths = lambda key: {(x.prompt_index, x.repeat): min(1.0, x.tokens / scale) for x in store.rows(key)}  # noqa: E731
        i = compare(lengths(r["key"]), lengths(ref["key"]), confidence)
        (longer if i.low > 0 else not_longer if i.high <= LENGTH_MARGIN else undecided).append((r, i))
        if i.high < 0:
            shorter.append((r, i))
        if r["modelled_speedup_measured_c_rel"] and not math.isnan(r["length_adjusted_speedup_measured_c_rel"]):
            ratios.append(r["length_adjusted_speedup_measured_c_rel"] / r["modelled_speedup_measured_c_rel"])
    return longer, shorter, not_longer, undecided, ratios


def finding_tune_n(rows: list[dict], column: str) -> Finding:
    f = Finding("5", "tuning N under strict buys a speed-up comparable to relaxation",
                f"for most (drafter, task) pairs, strict's best S over N is >= {COMPARABLE:g} x the best S of any "
                "cell within the budget (strict or relaxed, any N)")
    pairs = sorted({(r["drafter"], r["task"]) for r in rows if r["method"] == STRICT})
    results = {False: [], True: []}
    for drafter, task in pairs:
        cells = _speculative(rows, drafter, task)
        strict = [r for r in cells if r["method"] == STRICT and not math.isnan(r[column])]
        if len({r["draft_length"] for r in strict}) < 2:
            continue
        top, bottom = max(strict, key=lambda r: r[column]), min(strict, key=lambda r: r[column])
        for lenient, eligible in ((False, _within), (True, _not_beyond)):
            best = _best(cells, column, eligible)
            results[lenient].append(top[column] / best[column])
        best = _best(cells, column, _within)
        f.evidence.append(f"{task} / {drafter}: strict S {_f(bottom[column])}x (N={bottom['draft_length']}) -> "
                          f"{_f(top[column])}x (N={top['draft_length']}) by tuning N; best within budget "
                          f"{method_label(best['method'], json.loads(best['params']))} N={best['draft_length']} "
                          f"{_f(best[column])}x; ratio {results[False][-1]:.2f}")
    if not results[False]:
        f.verdict, f.reason = _both_ways(False, False, "strict cells at two draft lengths or more, with AR (S)")
        return f
    majority = lambda xs: sum(x >= COMPARABLE for x in xs) > len(xs) / 2  # noqa: E731
    # Undecided cells counted as eligible can only raise the best, lowering the ratio: that is "against".
    f.verdict, f.reason = _both_ways(majority(results[True]), majority(results[False]))
    return f


def _config(r: dict) -> tuple:
    return r["method"], r["params"], r["draft_length"]


def finding_transfer(rows: list[dict], column: str) -> Finding:
    f = Finding("6", "the best hyper-parameters on one task are not the best on the other",
                f"for most drafters, the configuration (rule, parameters, N) with the highest S within the budget on "
                f"one task is, on the other, beyond the budget or below {TRANSFER:g} x that task's best S (either "
                "direction)")
    tasks = _tasks([r for r in rows if r["method"] != AR])
    drafters = sorted({r["drafter"] for r in rows if r["drafter"]})
    if len(tasks) < 2:
        f.verdict, f.reason = _both_ways(False, False, "a second task")
        return f
    fails = {False: [], True: []}
    for drafter in drafters:
        for lenient, eligible in ((False, _within), (True, _not_beyond)):
            failed = False
            for a in tasks:
                for b in tasks:
                    if a == b:
                        continue
                    best_a = _best(_speculative(rows, drafter, a), column, eligible)
                    cells_b = _speculative(rows, drafter, b)
                    best_b = _best(cells_b, column, eligible)
                    if best_a is None or best_b is None:
                        continue
                    same = next((r for r in cells_b if _config(r) == _config(best_a)), None)
                    ok = same is not None and (same["method"] == STRICT or eligible(same)) and \
                        same[column] >= TRANSFER * best_b[column]
                    failed |= not ok
                    if not lenient:
                        f.evidence.append(
                            f"{drafter}: best on {a} {method_label(best_a['method'], json.loads(best_a['params']))} "
                            f"N={best_a['draft_length']} ({_f(best_a[column])}x); on {b} it gives "
                            + (f"{_f(same[column])}x, {_diff(same) if _relaxed(same) else 'strict'}" if same else "-")
                            + f" vs {b}'s best {method_label(best_b['method'], json.loads(best_b['params']))} "
                            f"N={best_b['draft_length']} {_f(best_b[column])}x: {'transfers' if ok else 'does not transfer'}")
            fails[lenient].append(failed)
    majority = lambda xs: sum(xs) > len(xs) / 2  # noqa: E731
    # Which scenario is "against" is not monotone here: the verdict needs both to agree.
    a, b = majority(fails[False]), majority(fails[True])
    f.verdict, f.reason = _both_ways(a and b, a or b)
    return f


def matched_kind(i: Interval, max_drop: float) -> str:
    """A matched comparison's interval of (utility - the other's): better, worse, equivalent or undecided."""
    return "better" if i.low > 0 else "worse" if i.high < 0 else \
        "equivalent" if -max_drop <= i.low and i.high <= max_drop else "undecided"


def majority_verdict(found: dict) -> tuple[str, str]:
    """Better in more comparisons than worse and in at least a quarter of them, the undecided counted both ways."""
    total = sum(len(v) for v in found.values())

    def holds(better: int, worse: int) -> bool:
        return better > worse and better >= total / 4

    better, worse, undecided = len(found["better"]), len(found["worse"]), len(found["undecided"])
    return _both_ways(holds(better, worse + undecided), holds(better + undecided, worse))


def finding_pad(store, rows: list[dict], column: str, confidence: float, max_drop: float) -> Finding:
    f = Finding("PAD", "PAD keeps more utility than the training-free rules at matched length-adjusted speed-up",
                f"each PAD cell vs each training-free cell of the same drafter, task and N whose S lies within "
                f"{MATCH:.0%} of it (coupled paired interval of the utility difference: better above 0, worse below "
                f"0, equivalent within +-budget, else undecided): PAD better in more comparisons than worse, and "
                "in at least a quarter of them")
    found = {"better": [], "worse": [], "equivalent": [], "undecided": []}
    for p in rows:
        if not (_relaxed(p) and is_classifier_rule(p["method"])) or math.isnan(p[column]):
            continue
        for r in rows:
            if (r["drafter"], r["task"], r["draft_length"], r["seed"]) != (p["drafter"], p["task"], p["draft_length"],
                                                                          p["seed"]) or not _training_free(r) \
                    or math.isnan(r[column]) or abs(r[column] / p[column] - 1) > MATCH:
                continue
            i = compare(store.utilities(p["key"]), store.utilities(r["key"]), confidence)
            found[matched_kind(i, max_drop)].append((p, r, i))
    total = sum(len(v) for v in found.values())
    if not total:
        f.verdict, f.reason = _both_ways(False, False, "PAD cells with training-free cells at a matched speed-up")
        return f
    f.evidence.append(f"{total} matched comparisons: PAD " + ", ".join(f"{k} in {len(v)}" for k, v in found.items()))
    for p, r, i in (found["better"] + found["worse"])[:4]:
        f.evidence.append(f"  {_label(p)} ({_f(p[column])}x) - {method_label(r['method'], json.loads(r['params']))} "
                          f"({_f(r[column])}x): {_ci(i)}")
    f.verdict, f.reason = majority_verdict(found)
    return f


def check_findings(store, rows: list[dict], max_drop: float = FINDINGS_MAX_DROP, c_rel: float | None = None) \
        -> list[Finding]:
    """Every finding's verdict on the report rows of one settings group (report.build_rows)."""
    from relaxspec.bench.metrics import decision_confidence
    from relaxspec.bench.report import with_decisions
    from relaxspec.study.phase import finding_phase
    column = speed_column(c_rel)
    with_decisions(rows, max_drop)
    roles = drafter_roles(rows)
    looks = max((r["settings"]["looks"] or 1 for r in rows), default=1)
    confidence = decision_confidence(looks)
    return [finding_capability(store, rows, confidence), finding_mtp(rows, roles), finding_strong(rows, roles, column),
            finding_weak_lengths(store, rows, roles, column, confidence), finding_tune_n(rows, column),
            finding_transfer(rows, column), finding_pad(store, rows, column, confidence, max_drop),
            finding_phase(store, rows, confidence, max_drop)]


def format_findings(findings: list[Finding], rows: list[dict], max_drop: float, c_rel: float | None) -> str:
    roles = drafter_roles(rows)
    speed = "at the pair's measured c_rel" if c_rel is None else f"at c_rel {c_rel:g}"
    confidence = next((r["vs_strict_confidence"] for r in rows if _relaxed(r)), math.nan)
    out = [f"Findings of the investigation, checked on this run (settings group {rows[0]['settings_group']}: "
           f"{len(rows)} cells, tasks {', '.join(_tasks(rows))}).",
           f"Budget: a relaxed cell is within it when the lower end of its interval of (utility - strict's) at the "
           f"same N is >= -{max_drop:g}, beyond it when the upper end is < -{max_drop:g}, undecided otherwise "
           f"(coupled Tango paired intervals at {confidence:.1%}). S: length-adjusted modelled speed-up {speed}.",
           f"Drafters: MTP {roles['mtp'] or '-'}; strong LM {roles['strong'] or '-'}, weak LM {roles['weak'] or '-'} "
           f"(strict acceptance rate: " + (", ".join(f"{d} {a:.2f}" for d, a in sorted(roles["agreement"].items()))
                                            or "no LM drafter") + ")",
           "Verdict: the finding's test counted with the undecided cells against it and in its favour: confirmed "
           "if it holds both ways, not confirmed if it fails both ways, inconclusive otherwise or with evidence "
           "missing.", ""]
    for f in findings:
        out.append(f"({f.key}) {f.claim}")
        out.append(f"    test: {f.rule}")
        out.extend(f"    {line}" for line in f.evidence)
        out.append(f"    verdict: {f.verdict.upper()}: {f.reason}")
        out.append("")
    return "\n".join(out).rstrip()


__all__ = ["Finding", "check_findings", "format_findings", "drafter_roles", "speed_column", "FINDINGS_MAX_DROP",
           "CONFIRMED", "NOT_CONFIRMED", "INCONCLUSIVE"]
