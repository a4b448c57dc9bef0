"""`relaxspec report DIR --findings`: the seed investigation's findings, checked on a stored bench run.

Every verdict is read from the stored cells of one settings group (the latest, as the report) and the bench's
own statistics: each relaxed cell's coupled paired interval of (utility - strict's) at the same verifier,
drafter, task, N and seed (clustered score interval, at the finding's confidence: see Error control), its state against the budget `max_drop`
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

Error control: each verdict is one test whose intervals are simultaneous. A finding that reads m intervals
(the cells' differences vs strict, the comparisons between cells, the speed-up ratios) takes each at
confidence 1 - ALPHA / (looks * m) (Bonferroni over its intervals and the bench's looks), so with probability
>= 1 - ALPHA every interval it reads covers its truth, and then "confirmed" and "not confirmed" are both right
(an inconclusive verdict claims nothing): each verdict's error rate is <= ALPHA = 0.05. Speed-up comparisons
use intervals too: the ratio of two cells' length-adjusted modelled speed-ups, paired by sample (AR's tokens
cancel: mean(rounds x round cost) of one over the other's, Fieller's interval clustered by prompt).
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass, field

from relaxspec.bench import build_rows, methods, speedup, stats, with_decisions
from relaxspec.names import AR, STRICT, method_label

CONFIRMED, NOT_CONFIRMED, INCONCLUSIVE = "confirmed", "not confirmed", "inconclusive"
ALPHA = 0.05  # each verdict's error rate (see the module doc)
# The budget the findings are checked at unless another is given (`relaxspec report --findings`; the paper preset's
# later looks decide cells at it too). A run of ~80 paired samples cannot show a drop <= 0.03 even when every output
# equals strict's (Tango's interval at b = c = 0 is +-z^2/(n+z^2) = +-0.046 at n = 80, 95%).
DEFAULT_MAX_DROP = 0.1
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
    intervals: int = 0  # how many intervals the verdict reads (its Bonferroni count)
    confidence: float = math.nan  # each interval's


def speed_column(c_rel: float | None) -> str:
    """The length-adjusted modelled speed-up column of the report rows: at the measured c_rel (None) or at one
    of the grid's values."""
    if c_rel is None:
        return "length_adjusted_speedup_measured_c_rel"
    if c_rel not in speedup.C_REL_GRID:
        grid = ", ".join(f"{c:g}" for c in speedup.C_REL_GRID)
        raise ValueError(f"--c-rel must be one of {grid} (the bench's grid), got {c_rel:g}")
    return f"length_adjusted_speedup_c{c_rel:g}"


def _plain_column(column: str) -> str:
    return column.replace("length_adjusted_speedup_", "modelled_speedup_")


# ---------------------------------------------------------------- rule and drafter groups (declarations)

def _rules():
    from relaxspec.acceptance import RULES
    return RULES


def is_classifier_rule(method: str) -> bool:
    return methods.needs_classifier(method)


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
    return d if d in (stats.WITHIN, stats.BEYOND, stats.NO_STRICT) else "undecided"


def _label(r: dict) -> str:
    n = f" N={r['draft_length']}" if r["draft_length"] else ""
    return f"{r['task']} / {r['drafter']} {method_label(r['method'], json.loads(r['params']))}{n}"


def _ci(i: stats.Interval | None) -> str:
    return stats.format_interval(i, "{:+.3f}")


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
    return {s: states.count(s) for s in (stats.WITHIN, stats.BEYOND, "undecided")}


def _fmt_count(c: dict, total: int) -> str:
    return f"{c[stats.BEYOND]} of {total} beyond, {c[stats.WITHIN]} within, {c['undecided']} undecided"


def _s(r: dict | None, column: str) -> float:
    return math.nan if r is None else r[column]


def _f(x: float, places: int = 2) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{places}f}"


def simultaneous(looks: int, intervals: int) -> float:
    """Each interval's confidence when a verdict reads `intervals` of them (Bonferroni, with the bench's looks)."""
    return 1 - ALPHA / (max(1, looks) * max(1, intervals))


def _strict_of(rows: list[dict]) -> dict:
    return {(r["verifier"], r["drafter"], r["task"], r["draft_length"], r["seed"]): r for r in rows
            if r["method"] == STRICT}


def with_strict(rows: list[dict], keep) -> list[str]:
    """Keys of the relaxed rows with a strict reference for which keep(row) holds."""
    strict = _strict_of(rows)
    return [r["key"] for r in rows if _relaxed(r) and keep(r)
            and (r["verifier"], r["drafter"], r["task"], r["draft_length"], r["seed"]) in strict]


def _controlled(f: "Finding", store, rows: list[dict], used: list[str], extra: int, looks: int,
                max_drop: float) -> tuple[list[dict], float]:
    """The rows restated at the finding's simultaneous confidence over its len(used) cells vs strict and `extra`
    other intervals; the count and confidence recorded on the finding."""
    f.intervals = len(used) + extra
    f.confidence = simultaneous(looks, f.intervals)
    return restated(store, rows, used, f.confidence, max_drop), f.confidence


def restated(store, rows: list[dict], used, confidence: float, max_drop: float) -> list[dict]:
    """The rows, with the interval vs strict and the state of each relaxed row whose key is in `used` recomputed
    at `confidence` (copies; the other rows as they are)."""
    strict, used, out = _strict_of(rows), set(used), []
    for r in rows:
        ref = strict.get((r["verifier"], r["drafter"], r["task"], r["draft_length"], r["seed"]))
        if r["key"] in used and _relaxed(r) and ref is not None:
            i = stats.paired_diff_interval(store.utilities(r["key"]), store.utilities(ref["key"]), confidence)
            r = {**r, "vs_strict": i, "vs_strict_decision": stats.decision(i, max_drop),
                 "utility_diff_vs_strict": i.mean, "utility_diff_vs_strict_ci_low": i.low, "utility_diff_vs_strict_ci_high": i.high,
                 "vs_strict_confidence": confidence}
        out.append(r)
    return out


def speed_ratio(store, a: dict, b: dict, c_rel: float | None, confidence: float) -> stats.Interval:
    """S(a) / S(b): the ratio of two speculative cells' length-adjusted modelled speed-ups on the same task and
    seed, paired by (prompt, repeat). AR's tokens cancel, so it is mean(rounds_b * cost_b) / mean(rounds_a *
    cost_a), cost = 1 + (N + extra) c_rel (Leviathan's model at the column's c_rel: the given one, or each
    cell's measured one; N: the drafts per round the cell's model used, its mean for N=auto), with Fieller's
    interval clustered by prompt (bench.stats.ratio_interval)."""
    def costs(r):
        c = r["c_rel_measured"] if c_rel is None else c_rel
        per_round = 1 + (r["model_draft_length"] + r["extra_draft_passes"]) * c
        return {(x.prompt_index, x.repeat): speedup.rounds(x) * per_round for x in store.rows(r["key"])}
    ca, cb = costs(a), costs(b)
    keys = sorted(set(ca) & set(cb))
    return stats.ratio_interval([cb[k] for k in keys], [ca[k] for k in keys], confidence, [k[0] for k in keys])


# ---------------------------------------------------------------- the findings

def finding_capability(store, rows: list[dict], looks: int, max_drop: float) -> Finding:
    f = Finding("1", "relaxation needs capability evaluation: utility moves with the rule's strength",
                "(a) in some family (rule, drafter, task, N; its settings ordered by measured acceptance rate) the "
                "strongest setting's utility is below the weakest's (coupled paired interval of their difference "
                "wholly below 0), and (b) the run has relaxed cells both within the budget and beyond it (which "
                "relaxations are safe is only known by measuring)")
    families: dict[tuple, list] = {}
    for r in rows:
        if _training_free(r):
            families.setdefault((r["method"], r["drafter"], r["task"], r["draft_length"], r["seed"]), []).append(r)
    rows, confidence = _controlled(f, store, rows, with_strict(rows, _training_free),
                                   sum(len(c) >= 2 for c in families.values()), looks, max_drop)
    moves = []
    for cells in families.values():
        if len(cells) >= 2:
            weakest, strongest = min(cells, key=lambda r: r["acceptance_rate"]), max(cells, key=lambda r: r["acceptance_rate"])
            moves.append((weakest, strongest, stats.paired_diff_interval(
                store.utilities(strongest["key"]), store.utilities(weakest["key"]), confidence)))
    relaxed = [r for r in rows if _training_free(r) and _state(r) != stats.NO_STRICT]
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
    against = bool(dropping) and c[stats.WITHIN] > 0 and c[stats.BEYOND] > 0
    favour = any(m[2].low < 0 for m in moves) and c[stats.WITHIN] + c["undecided"] > 0 \
        and c[stats.BEYOND] + c["undecided"] > 0
    f.verdict, f.reason = _both_ways(against, favour)
    return f


def _group_shares(rows: list[dict], drafter: str) -> tuple[list, list]:
    mine = [r for r in rows if r["drafter"] == drafter and _training_free(r) and _state(r) != stats.NO_STRICT]
    return [r for r in mine if trusts_q(r["method"])], [r for r in mine if verifier_bounded(r["method"])]


def finding_mtp(store, rows: list[dict], roles: dict, looks: int, max_drop: float) -> Finding:
    f = Finding("2", "with the MTP drafter, rules that trust q lose utility while CACTUS and mentored stay close",
                f"MTP drafter: >= {SHARE_LOSES:.0%} of the q-trusting rules' cells (declared trusts_q) beyond the "
                f"budget, and <= {SHARE_CLOSE:.0%} of the verifier-bounded rules' cells (reads q, no trust, "
                "accepts at least as strict) beyond it")
    mtp = roles["mtp"]
    if mtp is None:
        f.verdict, f.reason = _both_ways(False, False, "an MTP drafter in this run")
        return f
    rows, _ = _controlled(f, store, rows, with_strict(rows, lambda r: r["drafter"] == mtp and _training_free(r) and (
        trusts_q(r["method"]) or verifier_bounded(r["method"]))), 0, looks, max_drop)
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

    f.verdict, f.reason = _both_ways(holds(ct[stats.BEYOND], cb[stats.BEYOND] + cb["undecided"]),
                                     holds(ct[stats.BEYOND] + ct["undecided"], cb[stats.BEYOND]))
    return f


def _best(cells: list[dict], column: str, eligible) -> dict | None:
    ok = [r for r in cells if (r["method"] == STRICT or (_relaxed(r) and eligible(r))) and not math.isnan(r[column])]
    return max(ok, key=lambda r: r[column], default=None)


def _within(r: dict) -> bool:
    return _state(r) == stats.WITHIN


def _not_beyond(r: dict) -> bool:
    return _state(r) in (stats.WITHIN, "undecided")


def _speculative(rows: list[dict], drafter: str, task: str) -> list[dict]:
    return [r for r in rows if r["drafter"] == drafter and r["task"] == task and r["method"] != AR]


def _tasks(rows: list[dict]) -> list[str]:
    return sorted({r["task"] for r in rows})


def finding_strong(store, rows: list[dict], roles: dict, column: str, c_rel: float | None, looks: int,
                   max_drop: float) -> Finding:
    f = Finding("3", "a strong drafter gives near-lossless relaxed speed-ups, at a higher c_rel",
                f"strong LM drafter, on every task: some relaxed cell within the budget has S >= {SPEED_GAIN:g} x "
                "strict's S at every N (the lower end of the interval of S / strict's S, paired by sample, at or "
                f"above {SPEED_GAIN:g} against each strict N); and its measured c_rel is above the MTP drafter's")
    strong, mtp = roles["strong"], roles["mtp"]
    missing = "two LM drafters (strong and weak)" if strong is None else "an MTP drafter" if mtp is None else ""
    if missing:
        f.verdict, f.reason = _both_ways(False, False, missing)
        return f
    c_rel_of = {d: [r["c_rel_measured"] for r in rows if r["drafter"] == d and r["method"] == STRICT]
                for d in (strong, mtp)}
    c_rel_of = {d: statistics.fmean(v) if v else math.nan for d, v in c_rel_of.items()}  # no strict cell: no value
    higher = c_rel_of[strong] > c_rel_of[mtp]
    f.evidence.append(f"measured c_rel: {strong} {_f(c_rel_of[strong], 3)}, {mtp} {_f(c_rel_of[mtp], 3)} (higher: {higher}; "
                      "as `models list` measures them: an LM's one-token step, a head's time per drafted token "
                      "through the drafter protocol, over the verifier's step)")
    mine = lambda r: r["drafter"] == strong and _training_free(r)  # noqa: E731
    stricts = {t: [r for r in _speculative(rows, strong, t) if r["method"] == STRICT and not math.isnan(r[column])]
               for t in _tasks(rows)}
    pairs = sum(len([r for r in _speculative(rows, strong, t) if _training_free(r)]) * len(stricts[t]) for t in stricts)
    rows, confidence = _controlled(f, store, rows, with_strict(rows, mine), pairs, looks, max_drop)
    if any(not stricts[t] for t in stricts):
        f.verdict, f.reason = _both_ways(False, False, "strict cells with a speed-up for the strong drafter")
        return f
    holds = {False: [], True: []}  # undecided cells eligible?
    for task in _tasks(rows):
        cells = [r for r in _speculative(rows, strong, task) if _training_free(r) and _not_beyond(r)]
        gains = {r["key"]: [speed_ratio(store, r, s, c_rel, confidence) for s in stricts[task]] for r in cells}
        low = {k: min(i.low for i in g) for k, g in gains.items()}  # against every strict N
        high = {k: min(i.high for i in g) for k, g in gains.items()}
        holds[False].append(any(low[r["key"]] >= SPEED_GAIN for r in cells if _within(r)))
        holds[True].append(any(high[r["key"]] >= SPEED_GAIN for r in cells))
        top = max(stricts[task], key=lambda r: r[column])
        best = max((r for r in cells if _within(r)), key=lambda r: low[r["key"]], default=None)
        f.evidence.append(f"{task}: strict's best {_f(top[column])}x (N={top['draft_length']}); relaxed within budget "
                          "with the highest lower bound of its gain over every strict N: " +
                          (f"{_label(best)} {_f(best[column])}x, {_diff(best)}, gain over strict's best "
                           f"{_ci(speed_ratio(store, best, top, c_rel, confidence))} (lower bound over every N "
                           f"{_f(low[best['key']], 3)})" if best else "none"))
    f.evidence.append(f"gain bar {SPEED_GAIN}: holds on {sum(holds[False])} of {len(holds[False])} tasks by lower "
                      f"bounds of cells within the budget; could on {sum(holds[True])} (upper bounds, undecided cells "
                      "counted in)")
    f.verdict, f.reason = _both_ways(higher and all(holds[False]), higher and all(holds[True]))
    return f


def finding_weak_lengths(store, rows: list[dict], roles: dict, column: str, looks: int) -> Finding:
    f = Finding("4", "weak drafters under relaxation lengthen responses (length-adjusted speed-up below the plain one)",
                f"weak LM drafter: >= {SHARE_LONGER:.0%} of its relaxed cells give significantly longer responses "
                "than strict (paired interval of the length difference, as a share of max_new_tokens, above 0), "
                "at least twice as many as give significantly shorter ones (interval below 0); a cell whose "
                f"interval ends below +{LENGTH_MARGIN:g} is decided not longer")
    weak = roles["weak"]
    if weak is None:
        f.verdict, f.reason = _both_ways(False, False, "two LM drafters (strong and weak)")
        return f
    f.intervals = len(with_strict(rows, lambda r: r["drafter"] == weak and _training_free(r)))
    f.confidence = confidence = simultaneous(looks, f.intervals)  # the verdict reads the weak drafter's cells
    counts = {}
    for d in [weak] + [x for x in (roles["strong"], roles["mtp"]) if x]:
        longer, shorter, not_longer, undecided, ratios = length_changes(store, rows, d, confidence)
        counts[d] = (len(longer), len(shorter), len(undecided), len(longer) + len(not_longer) + len(undecided))
        mean_ratio = statistics.fmean(ratios) if ratios else math.nan
        f.evidence.append(f"{d}: of {counts[d][3]} relaxed cells, {len(longer)} significantly longer than strict, "
                          f"{len(not_longer)} not longer ({len(shorter)} of them shorter), {len(undecided)} undecided; "
                          f"mean S_len / S {_f(mean_ratio)}")
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
        i = stats.paired_diff_interval(lengths(r["key"]), lengths(ref["key"]), confidence)
        (longer if i.low > 0 else not_longer if i.high <= LENGTH_MARGIN else undecided).append((r, i))
        if i.high < 0:
            shorter.append((r, i))
        if r["modelled_speedup_measured_c_rel"] and not math.isnan(r["length_adjusted_speedup_measured_c_rel"]):
            ratios.append(r["length_adjusted_speedup_measured_c_rel"] / r["modelled_speedup_measured_c_rel"])
    return longer, shorter, not_longer, undecided, ratios


def finding_tune_n(store, rows: list[dict], column: str, c_rel: float | None, looks: int, max_drop: float) -> Finding:
    f = Finding("5", "tuning N under strict buys a speed-up comparable to relaxation",
                f"for most (drafter, task) pairs, strict's best S over N is >= {COMPARABLE:g} x the S of every cell "
                "within the budget (strict or relaxed, any N): the interval of the ratio, paired by sample, at or "
                f"above {COMPARABLE:g}")
    pairs = [(d, t) for d, t in sorted({(r["drafter"], r["task"]) for r in rows if r["method"] == STRICT})
             if len({r["draft_length"] for r in _speculative(rows, d, t) if r["method"] == STRICT
                     and not math.isnan(r[column])}) >= 2]
    cells_of = {p: [r for r in _speculative(rows, *p) if not math.isnan(r[column])] for p in pairs}
    in_pairs = {r["key"] for cells in cells_of.values() for r in cells}
    rows, confidence = _controlled(f, store, rows, with_strict(rows, lambda r: r["key"] in in_pairs),
                                   len(in_pairs), looks, max_drop)
    results = {False: [], True: []}
    for drafter, task in pairs:
        cells = [r for r in _speculative(rows, drafter, task) if not math.isnan(r[column])]
        strict = [r for r in cells if r["method"] == STRICT]
        top, bottom = max(strict, key=lambda r: r[column]), min(strict, key=lambda r: r[column])
        ratios = {r["key"]: speed_ratio(store, top, r, c_rel, confidence) for r in cells if r["key"] != top["key"]}
        bound = lambda r, end: getattr(ratios[r["key"]], end) if r["key"] in ratios else 1.0  # noqa: E731
        # holds for the pair when strict's best rivals every eligible cell: by lower bounds with the undecided
        # cells eligible (against the finding), by upper bounds with the cells within only (in its favour)
        results[True].append(all(bound(r, "low") >= COMPARABLE for r in cells
                                 if r["method"] == STRICT or _not_beyond(r)))
        results[False].append(all(bound(r, "high") >= COMPARABLE for r in cells if r["method"] == STRICT or _within(r)))
        best = _best(cells, column, _within)
        f.evidence.append(f"{task} / {drafter}: strict S {_f(bottom[column])}x (N={bottom['draft_length']}) -> "
                          f"{_f(top[column])}x (N={top['draft_length']}) by tuning N; best within budget "
                          f"{method_label(best['method'], json.loads(best['params']))} N={best['draft_length']} "
                          f"{_f(best[column])}x; strict's best / it "
                          + (_ci(ratios[best["key"]]) if best["key"] in ratios else "1 (itself)"))
    if not pairs:
        f.verdict, f.reason = _both_ways(False, False, "strict cells at two draft lengths or more, with AR (S)")
        return f
    majority = lambda xs: sum(xs) > len(xs) / 2  # noqa: E731
    f.verdict, f.reason = _both_ways(majority(results[True]), majority(results[False]))
    return f


def _config(r: dict) -> tuple:
    return r["method"], r["params"], r["draft_length"]


def finding_transfer(store, rows: list[dict], column: str, c_rel: float | None, looks: int,
                     max_drop: float) -> Finding:
    f = Finding("6", "the best hyper-parameters on one task are not the best on the other",
                f"for most drafters, the configuration (rule, parameters, N) with the highest S within the budget on "
                f"one task is, on the other, beyond the budget or below {TRANSFER:g} x that task's best S (either "
                "direction; the ratio of the two S by its interval, paired by sample)")
    tasks = _tasks([r for r in rows if r["method"] != AR])
    drafters = sorted({r["drafter"] for r in rows if r["drafter"]})
    rows, confidence = _controlled(f, store, rows, with_strict(rows, lambda r: True),
                                   len(drafters) * len(tasks) * (len(tasks) - 1), looks, max_drop)
    if len(tasks) < 2:
        f.verdict, f.reason = _both_ways(False, False, "a second task")
        return f
    sure_fail, sure_ok = [], []  # per drafter: fails to transfer for sure; transfers for sure (both directions)
    for drafter in drafters:
        fails = transfers = None
        for a in tasks:
            for b in tasks:
                best_a = _best(_speculative(rows, drafter, a), column, _within)
                cells_b = _speculative(rows, drafter, b)
                best_b = _best(cells_b, column, _within)
                if a == b or best_a is None or best_b is None:
                    continue
                same = next((r for r in cells_b if _config(r) == _config(best_a)), None)
                i = None if same is None or same is best_b else speed_ratio(store, same, best_b, c_rel, confidence)
                good = same is not None and (same["method"] == STRICT or _within(same))
                possible = same is not None and (same["method"] == STRICT or _not_beyond(same))
                ok = good and (i is None or i.low >= TRANSFER)  # transfers for sure
                bad = not possible or (i is not None and i.high < TRANSFER)  # fails for sure
                fails, transfers = bool(fails) or bad, (transfers is None or transfers) and ok
                f.evidence.append(
                    f"{drafter}: best on {a} {method_label(best_a['method'], json.loads(best_a['params']))} "
                    f"N={best_a['draft_length']} ({_f(best_a[column])}x); on {b} it gives "
                    + (f"{_f(same[column])}x, {_diff(same) if _relaxed(same) else 'strict'}" if same else "-")
                    + f" vs {b}'s best {method_label(best_b['method'], json.loads(best_b['params']))} "
                    f"N={best_b['draft_length']} {_f(best_b[column])}x (ratio {_ci(i) if i else '1' if same else '-'}): "
                    + ("transfers" if ok else "does not transfer" if bad else "undecided"))
        if fails is not None:
            sure_fail.append(fails)
            sure_ok.append(bool(transfers))
    majority = lambda xs: sum(xs) > len(xs) / 2  # noqa: E731
    f.verdict, f.reason = _both_ways(majority(sure_fail), majority([not x for x in sure_ok]))
    return f


def matched_kind(i: stats.Interval, max_drop: float) -> str:
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


def finding_pad(store, rows: list[dict], column: str, looks: int, max_drop: float) -> Finding:
    f = Finding("PAD", "PAD keeps more utility than the training-free rules at matched length-adjusted speed-up",
                f"each PAD cell vs each training-free cell of the same drafter, task and N whose S lies within "
                f"{MATCH:.0%} of it (coupled paired interval of the utility difference: better above 0, worse below "
                f"0, equivalent within +-budget, else undecided): PAD better in more comparisons than worse, and "
                "in at least a quarter of them")
    found = {"better": [], "worse": [], "equivalent": [], "undecided": []}
    matched = [(p, r) for p in rows if _relaxed(p) and is_classifier_rule(p["method"]) and not math.isnan(p[column])
               for r in rows
               if (r["drafter"], r["task"], r["draft_length"], r["seed"]) == (p["drafter"], p["task"], p["draft_length"],
                                                                             p["seed"]) and _training_free(r)
               and not math.isnan(r[column]) and abs(stats.ratio(r[column], p[column]) - 1) <= MATCH]
    f.intervals, f.confidence = len(matched), simultaneous(looks, len(matched))
    for p, r in matched:
        i = stats.paired_diff_interval(store.utilities(p["key"]), store.utilities(r["key"]), f.confidence)
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


# Phase-aware relaxation (issue 28): does relaxing only a span of the response (a bench run with `--phase`, e.g.
# the task's worked steps) keep utility closer to strict than relaxing everywhere, at the same acceptance length?
#
# finding_phase pairs the report's settings group with the stored group whose settings differ only in `phase`: each
# relaxed cell run with a phase against the cell of the same drafter, task, N, seed and rule run without one whose
# mean acceptance length (with bonus) is closest, if within MATCH_TAU of it; each pair's coupled paired interval of
# the utility difference (the same samples' seeds) says better (above 0), worse (below 0), equivalent (within
# +-budget) or undecided. Confirmed when the phase runs are better in more pairs than worse and in at least a
# quarter of them, counting the undecided pairs both ways (as the other findings).

MATCH_TAU = 0.05  # acceptance lengths within 5% of each other count as the same


def _same_but_phase(a: dict, b: dict) -> bool:
    return all(a.get(k) == b.get(k) for k in set(a) | set(b) if k != "phase")


def finding_phase(store, rows: list[dict], looks: int, max_drop: float) -> Finding:
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
        i = stats.paired_diff_interval(store.utilities(p["key"]), store.utilities(r["key"]), f.confidence)
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


def check_findings(store, rows: list[dict], max_drop: float, c_rel: float | None = None) -> list[Finding]:
    """Every finding's verdict on the report rows of one settings group (report.build_rows), each at its own
    simultaneous confidence (see the module doc), against the budget `max_drop` (its caller's: `relaxspec report
    --findings` passes DEFAULT_MAX_DROP, the paper preset's, unless --max-drop is given)."""
    column = speed_column(c_rel)
    with_decisions(rows, max_drop)
    roles = drafter_roles(rows)
    looks = max((r["settings"]["looks"] or 1 for r in rows), default=1)
    return [finding_capability(store, rows, looks, max_drop), finding_mtp(store, rows, roles, looks, max_drop),
            finding_strong(store, rows, roles, column, c_rel, looks, max_drop),
            finding_weak_lengths(store, rows, roles, column, looks),
            finding_tune_n(store, rows, column, c_rel, looks, max_drop),
            finding_transfer(store, rows, column, c_rel, looks, max_drop),
            finding_pad(store, rows, column, looks, max_drop),
            finding_phase(store, rows, looks, max_drop)]


def format_findings(findings: list[Finding], rows: list[dict], max_drop: float, c_rel: float | None) -> str:
    roles = drafter_roles(rows)
    speed = "at the pair's measured c_rel" if c_rel is None else f"at c_rel {c_rel:g}"
    out = [f"Findings of the investigation, checked on this run (settings group {rows[0]['settings_group']}: "
           f"{len(rows)} cells, tasks {', '.join(_tasks(rows))}).",
           f"Budget: a relaxed cell is within it when the lower end of its interval of (utility - strict's) at the "
           f"same N is >= -{max_drop:g}, beyond it when the upper end is < -{max_drop:g}, undecided otherwise "
           f"(coupled paired intervals, clustered by prompt). S: length-adjusted modelled speed-up {speed}.",
           f"Drafters: MTP {roles['mtp'] or '-'}; strong LM {roles['strong'] or '-'}, weak LM {roles['weak'] or '-'} "
           f"(strict acceptance rate: " + (", ".join(f"{d} {_f(a)}" for d, a in sorted(roles["agreement"].items()))
                                            or "no LM drafter") + ")",
           "Verdict: the finding's test counted with the undecided cells against it and in its favour: confirmed "
           "if it holds both ways, not confirmed if it fails both ways, inconclusive otherwise or with evidence "
           f"missing. Each verdict is one test with error rate <= {ALPHA:g}: the intervals it reads are simultaneous "
           "(Bonferroni over them and the bench's looks; the confidence of each is printed with its test).", ""]
    for f in findings:
        out.append(f"({f.key}) {f.claim}")
        out.append(f"    test: {f.rule}")
        if f.intervals:
            out.append(f"    error rate <= {ALPHA:g}: {f.intervals} intervals, each at {f.confidence:.4%}")
        out.extend(f"    {line}" for line in f.evidence)
        out.append(f"    verdict: {f.verdict.upper()}: {f.reason}")
        out.append("")
    return "\n".join(out).rstrip()


__all__ = ["DEFAULT_MAX_DROP", "Finding", "check_findings", "format_findings", "drafter_roles", "speed_column", "CONFIRMED", "NOT_CONFIRMED",
           "INCONCLUSIVE"]
