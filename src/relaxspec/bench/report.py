"""Reports from a result store: per-cell rows with their comparisons, the terminal report, best rule, CSV.

Cells run with different settings are never mixed: rows carry a settings group (SETTINGS), each group is
its own table with its settings in the header, and comparisons only pair cells of one group. The default
is the group of the latest stored cell; `groups="all"` reports every group.
"""

from __future__ import annotations

import csv
import json
import math
import statistics
from pathlib import Path

from relaxspec.bench.metrics import ALPHA, compare, decision_confidence, identical_fraction
from relaxspec.bench.names import AR, STRICT, draft_length_order, method_label
from relaxspec.bench.speedup import C_REL_GRID, length_adjusted_speedup
from relaxspec.bench.stats import (BEYOND, METHOD, NO_STRICT, WITHIN, Interval, decision, format_interval,
                                   is_decided, ratio, samples_needed)
from relaxspec.bench.store import Store

_SPEED = ["measured_c_rel", *[f"c{c:g}" for c in C_REL_GRID]]
CSV_COLUMNS = [
    "settings_group", "verifier", "drafter", "task", "method", "params", "draft_length", "seed", "n_prompts",
    "n_samples", "utility", "utility_ci_low", "utility_ci_high",
    "utility_diff_vs_strict", "utility_diff_vs_strict_ci_low", "utility_diff_vs_strict_ci_high",
    "outputs_identical_to_strict", "vs_strict_confidence", "vs_strict_decision", "vs_strict_samples_needed",
    "utility_diff_vs_ar", "utility_diff_ci_low", "utility_diff_ci_high",
    "acceptance_rate", "acceptance_rate_per_position", "mean_acceptance_length", "extra_draft_passes",
    "mean_response_length", "c_rel_measured", "c_block_measured", "c_pivot_measured", "model_draft_length",
    "measured_speedup_batch1", "batch1_prompts", "measured_speedup_batched", "tokens_per_s",
    "modelled_speedup_measured_c_rel", *[f"modelled_speedup_c{c:g}" for c in C_REL_GRID],
    "block_aware_speedup_measured",
    *[f"length_adjusted_speedup_{s}" for s in _SPEED], "length_adjusted_block_aware_speedup_measured",
    "temperature", "top_p", "top_k", "max_new_tokens", "truncated_fraction", "compile", "code_version", "key",
]
# Settings that make cells comparable: cells differing in any of these are reported in separate groups.
SETTINGS = ("limit", "first_repeats", "looks", "temperature", "top_k", "top_p", "max_new_tokens", "batch_size",
            "device", "dtype", "compile", "chat_template", "system", "code_version", "phase", "draft_confidence")
_PLAN_SETTINGS = ("first_repeats", "looks")  # how a cell was sampled (in its metrics, not its key)
# What an AR cell shares with a speculative cell it is the baseline of (within one settings group).
_AR_FIELDS = ("verifier", "verifier_version", "task", "seed")
_STRICT_FIELDS = (*_AR_FIELDS, "drafter", "drafter_version", "draft_length")


def settings_of(cell) -> dict:
    return {k: (cell.metrics if k in _PLAN_SETTINGS else cell.config).get(k) for k in SETTINGS}


def _sig(config: dict, names) -> str:
    return json.dumps([config.get(f) for f in names], sort_keys=True)


def settings_groups(store: Store) -> list[tuple[dict, list]]:
    """[(settings, cells)], oldest group first (ordered by each group's latest cell)."""
    groups: dict[str, tuple[dict, list]] = {}
    latest: dict[str, int] = {}
    for position, cell in enumerate(store.cells()):  # oldest first
        settings = settings_of(cell)
        sig = json.dumps(settings, sort_keys=True)
        groups.setdefault(sig, (settings, []))[1].append(cell)
        latest[sig] = position
    return [groups[sig] for sig in sorted(groups, key=latest.get)]


def build_rows(store: Store, groups: str = "latest") -> list[dict]:
    """One dict per stored cell (CSV_COLUMNS keys), of the latest settings group or of all ("all")."""
    found = settings_groups(store)
    if groups not in ("latest", "all"):
        raise ValueError(f"groups must be 'latest' or 'all', got {groups!r}")
    chosen = found[-1:] if groups == "latest" else found
    rows = []
    for settings, cells in chosen:
        index = found.index((settings, cells)) + 1
        rows.extend(_group_rows(store, cells, index, settings))
    return rows


def _group_rows(store: Store, cells: list, index: int, settings: dict) -> list[dict]:
    ar = {_sig(c.config, _AR_FIELDS): c for c in cells if c.config["method"] == AR}
    strict = {_sig(c.config, _STRICT_FIELDS): c for c in cells if c.config["method"] == STRICT}
    rows = []
    for cell in cells:
        cfg, m = cell.config, cell.metrics
        base = ar.get(_sig(cfg, _AR_FIELDS))
        ref = strict.get(_sig(cfg, _STRICT_FIELDS)) if cfg["method"] not in (AR, STRICT) else None
        row = {
            "settings_group": index, "settings": settings,
            "verifier": cfg["verifier"], "drafter": cfg["drafter"] or "", "task": cfg["task"],
            "method": cfg["method"], "params": json.dumps(cfg["params"], sort_keys=True),
            "draft_length": cfg["draft_length"], "seed": cfg["seed"],
            # the drafts per round the speed model used (older stores: N)
            "model_draft_length": m.get("model_draft_length", cfg["draft_length"]),
            **{k: m.get(k, math.nan) for k in (
                "n_prompts", "n_samples", "utility", "utility_ci_low", "utility_ci_high", "acceptance_rate",
                "mean_acceptance_length", "extra_draft_passes", "mean_response_length", "c_rel_measured",
                "c_block_measured", "c_pivot_measured", "measured_speedup_batch1", "batch1_prompts", "tokens_per_s",
                "modelled_speedup_measured_c_rel", "block_aware_speedup_measured", "truncated_fraction",
                *[f"modelled_speedup_c{c:g}" for c in C_REL_GRID])},
            "acceptance_rate_per_position": json.dumps([round(x, 4) for x in m.get("acceptance_rate_per_position", [])]),
            "batch1_halves": m.get("batch1_halves"),  # (report only: x b1 on each half of the prompts timed)
            "temperature": cfg["temperature"], "top_p": cfg["top_p"], "top_k": cfg["top_k"],
            "max_new_tokens": cfg["max_new_tokens"], "compile": bool(cfg.get("compile")),
            "code_version": cfg["code_version"], "key": cell.key,
        }
        row.update(_vs_ar(store, cell, base))
        row.update(_vs_strict(store, cell, ref, m.get("looks", 1)))
        rows.append(row)
    order = {AR: 0, STRICT: 1}
    rows.sort(key=lambda r: (r["verifier"], r["task"], r["seed"], r["drafter"], draft_length_order(r["draft_length"]),
                             order.get(r["method"], 2), r["method"], _param_order(r["params"])))
    return rows


def _vs_ar(store: Store, cell, base) -> dict:
    """Paired difference vs AR (95%), measured speed-ups vs AR, length-adjusted modelled speed-ups."""
    m = cell.metrics
    if base is None:
        return {"utility_diff_vs_ar": math.nan, "utility_diff_ci_low": math.nan, "utility_diff_ci_high": math.nan,
                "measured_speedup_batched": math.nan, "length_adjusted_block_aware_speedup_measured": math.nan,
                **{f"length_adjusted_speedup_{s}": math.nan for s in _SPEED}}
    diff = Interval(0.0, 0.0, 0.0, m["n_samples"]) if base.key == cell.key else \
        compare(store.utilities(cell.key), store.utilities(base.key), 1 - ALPHA)
    l_ar, l_m = base.metrics["mean_response_length"], m["mean_response_length"]
    out = {"utility_diff_vs_ar": diff.mean, "utility_diff_ci_low": diff.low, "utility_diff_ci_high": diff.high,
           "measured_speedup_batched": ratio(m["tokens_per_s"], base.metrics["tokens_per_s"]),
           "length_adjusted_block_aware_speedup_measured":
               length_adjusted_speedup(m["block_aware_speedup_measured"], l_ar, l_m)}
    for s in _SPEED:
        out[f"length_adjusted_speedup_{s}"] = length_adjusted_speedup(m[f"modelled_speedup_{s}"], l_ar, l_m)
    return out


def _vs_strict(store: Store, cell, ref, looks: int) -> dict:
    """Coupled paired difference vs strict at the same N, at the decision confidence, and its decision."""
    if cell.config["method"] in (AR, STRICT):
        return {"utility_diff_vs_strict": math.nan, "utility_diff_vs_strict_ci_low": math.nan,
                "utility_diff_vs_strict_ci_high": math.nan, "outputs_identical_to_strict": math.nan,
                "vs_strict_confidence": math.nan, "vs_strict_decision": "", "vs_strict_samples_needed": "",
                "vs_strict": None}
    confidence = decision_confidence(looks)
    if ref is None:
        diff, same = Interval(math.nan, math.nan, math.nan, 0, confidence), math.nan
    else:
        diff = compare(store.utilities(cell.key), store.utilities(ref.key), confidence)
        same = identical_fraction(store.token_hashes(cell.key), store.token_hashes(ref.key))
    return {"utility_diff_vs_strict": diff.mean, "utility_diff_vs_strict_ci_low": diff.low,
            "utility_diff_vs_strict_ci_high": diff.high, "outputs_identical_to_strict": same,
            "vs_strict_confidence": confidence, "vs_strict": diff}


def with_decisions(rows: list[dict], max_drop: float) -> list[dict]:
    """Each relaxed row's decision vs the budget (see stats.decision) and the samples it would need."""
    for r in rows:
        if r.get("vs_strict") is not None:
            r["vs_strict_decision"] = decision(r["vs_strict"], max_drop)
            r["vs_strict_samples_needed"] = samples_needed(r["vs_strict"], max_drop) \
                if r["vs_strict"].n else ""
    return rows


def _param_order(params_json: str) -> tuple:
    return tuple((k, float(v) if isinstance(v, (int, float)) else float("inf"))
                 for k, v in sorted(json.loads(params_json).items()))


def write_csv(rows: list[dict], path: str | Path) -> Path:
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"--csv {path} is a directory; give a file path")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("w", newline="", encoding="utf-8") as f:
            writer = csv.DictWriter(f, fieldnames=CSV_COLUMNS, extrasaction="ignore")
            writer.writeheader()
            for row in rows:
                writer.writerow({k: _csv_value(row.get(k)) for k in CSV_COLUMNS})
    except OSError as e:
        raise ValueError(f"cannot write the CSV to {path}: {e.strerror or e}") from None
    return path


def _csv_value(v):
    if isinstance(v, float):
        return "" if math.isnan(v) else f"{v:.6g}"
    return "" if v is None else v


SPEED_COLUMNS = [*[(f"c_rel {c:g}", f"length_adjusted_speedup_c{c:g}") for c in C_REL_GRID],
                 ("measured c_rel", "length_adjusted_speedup_measured_c_rel"),
                 ("block-aware, measured", "length_adjusted_block_aware_speedup_measured")]


def best_rules(rows: list[dict], max_drop: float) -> list[dict]:
    """Per (settings group, verifier, drafter, task) and speed column: the eligible cell with the highest
    length-adjusted speed-up. Eligible: strict (lossless) and every relaxed cell whose upper bound of the drop
    vs strict is within the budget. Also counts the cells left out because their interval straddles it."""
    out = []
    groups: dict[tuple, list] = {}
    for r in rows:
        if r["method"] != AR:
            groups.setdefault((r["settings_group"], r["verifier"], r["drafter"], r["task"]), []).append(r)
    for (group, verifier, drafter, task), cells in groups.items():
        with_decisions(cells, max_drop)
        eligible = [r for r in cells if r["method"] == STRICT or r["vs_strict_decision"] == WITHIN]
        undecidable = [r for r in cells if r["vs_strict_decision"] not in ("", WITHIN, BEYOND, NO_STRICT)]
        for label, col in SPEED_COLUMNS:
            ok = [r for r in eligible if not math.isnan(r[col])]
            best = max(ok, key=lambda r: r[col], default=None)
            out.append({"settings_group": group, "verifier": verifier, "drafter": drafter, "task": task,
                        "column": label, "best": best, "speedup": best[col] if best else math.nan,
                        "undecidable": undecidable})
    return out


def _label(r: dict) -> str:
    return method_label(r["method"], json.loads(r["params"]))


def _f(x, fmt="{:.2f}") -> str:
    if x is None or x == "" or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return fmt.format(x)


def prompts_x_repeats(prompts, samples) -> str:
    """'80x8' (prompts x repeats per prompt), or '640 (80 prompts)' when prompts have different repeats."""
    if _nan(prompts) or _nan(samples) or not prompts:
        return _f(samples, "{:.0f}")
    prompts, samples = int(prompts), int(samples)
    return f"{prompts}x{samples // prompts}" if samples % prompts == 0 else f"{samples} ({prompts} prompts)"


def format_report(rows: list[dict], max_drop: float, groups_total: int | None = None) -> str:
    """The terminal report: per settings group, its settings, the table, the sanity check, the decisions
    and the best rule per speed column."""
    if not rows:
        return "no finished cells"
    with_decisions(rows, max_drop)
    out = []
    shown = sorted({r["settings_group"] for r in rows})
    if groups_total and groups_total > len(shown):
        out.append(f"(the store holds {groups_total} settings groups; showing the latest; --all shows every one)")
    for group in shown:
        out.extend(_format_group([r for r in rows if r["settings_group"] == group], max_drop))
        out.append("")
    return "\n".join(out).rstrip()


def _format_group(rows: list[dict], max_drop: float) -> list[str]:
    s = rows[0]["settings"]
    counts = sorted({r["n_prompts"] for r in rows})  # what the tasks had (a short file has fewer than the limit)
    prompts = f"{counts[0]}" if len(counts) == 1 else f"{counts[0]}-{counts[-1]}"
    out = [f"== settings group {rows[0]['settings_group']}: {prompts} prompts, first look {s['first_repeats']} "
           f"repeats, at most {s['looks']} looks; temperature {s['temperature']}, top_k {s['top_k']}, top_p "
           f"{s['top_p']}, max {s['max_new_tokens']} new tokens; chat template {s['chat_template']}, system "
           f"{s['system']!r}; device {s['device'] or 'default'}, dtype {s['dtype'] or 'default'}"
           f"{', compiled' if s.get('compile') else ''}; code "
           f"{s['code_version']}{'; relaxed only in the phase ' + repr(s['phase']) if s.get('phase') else ''} =="]
    head = ["task", "drafter", "method", "N", "n", "utility [95% CI]", "vs strict [CI]", "same", "state",
            "vs AR [95% CI]", "acc", "tau", "len", "S", "S_blk", "Slen.2", "x b1", "x batch"]
    lines = []
    for r in rows:
        relaxed = r["method"] not in (AR, STRICT)
        lines.append([
            r["task"], r["drafter"] or "-", _label(r), str(r["draft_length"]) if r["draft_length"] else "-",
            prompts_x_repeats(r["n_prompts"], r["n_samples"]),
            format_interval((r["utility"], r["utility_ci_low"], r["utility_ci_high"]), "{:.3f}"),
            format_interval((r["utility_diff_vs_strict"], r["utility_diff_vs_strict_ci_low"],
                             r["utility_diff_vs_strict_ci_high"]), "{:+.3f}")
            if relaxed else "-",
            _f(r["outputs_identical_to_strict"], "{:.0%}") if relaxed else "-",
            _state(r) if relaxed else "-",
            format_interval((r["utility_diff_vs_ar"], r["utility_diff_ci_low"], r["utility_diff_ci_high"]), "{:+.3f}")
            if r["method"] != AR else "-",
            _f(r["acceptance_rate"]), _f(r["mean_acceptance_length"]), _f(r["mean_response_length"], "{:.0f}"),
            _f(r["modelled_speedup_measured_c_rel"]), _f(r["block_aware_speedup_measured"]),
            _f(r["length_adjusted_speedup_c0.2"]), _f(r["measured_speedup_batch1"]),
            _f(r["measured_speedup_batched"]),
        ])
    widths = [max(len(h), *(len(line[i]) for line in lines)) for i, h in enumerate(head)]
    fmt = lambda cols: "  ".join(c.ljust(w) if i < 3 else c.rjust(w) for i, (c, w) in enumerate(zip(cols, widths)))  # noqa: E731
    out += [fmt(head), fmt(["-" * w for w in widths]), *[fmt(line) for line in lines], ""]
    confidence = next((r["vs_strict_confidence"] for r in rows if not _nan(r["vs_strict_confidence"])), None)
    out += [
        "n: prompts x repeats per prompt (samples). utility: mean with a 95% interval. vs strict: utility minus "
        "strict's at the same N, coupled and paired by (prompt, repeat)" + (f", at {confidence:.1%} (Bonferroni: "
                                                                           f"95% over {rows[0]['settings']['looks']} "
                                                                           "looks)" if confidence else "")
        + "; same: share of outputs token-for-token identical to strict's;",
        f"intervals: {METHOD};",
        f"state vs the budget (drop <= {max_drop:g}): within / beyond = the interval wholly inside / outside, "
        "narrow = half-width <= budget, OPEN = straddles it (± is the half-width); vs AR: paired, 95%.",
        "acc: acceptance rate; tau: tokens per sequence round (bonus included); len: mean response tokens; "
        "S: tau/(1+(N+extra)c_rel) at the measured c_rel (extra: the rule's declared extra drafter passes);",
        "S_blk: block-aware tau/((N+extra)c_rel+c_block+c_pivot), c_block measured, c_pivot: a pivot classifier's "
        "call per round / verifier step, measured, for rules that read one (0 for the others); "
        "Slen.2: length-adjusted S at c_rel 0.2; "
        "N=auto (and any N with --draft-confidence): N in S and S_blk is the cell's measured mean drafts per round, "
        "c_block interpolated at that mean + 1 between block widths measured for it; "
        "x b1: measured speed-up at batch 1 (latency; median per-token time, AR and method taking turns prompt "
        "by prompt); x batch: measured throughput ratio (tokens/s vs AR at the bench's batch).",
        *_drift(rows),
        "",
    ]
    out += _sanity(rows) + [""] + _decisions(rows, max_drop) + [""] + _best(rows, max_drop)
    return out


def _drift(rows: list[dict]) -> list[str]:
    """One line on x b1's precision: how far it moved between the first and the last half of the timed prompts."""
    moved = sorted(abs(h[0] - h[1]) for r in rows if (h := r.get("batch1_halves")) and not any(map(_nan, h)))
    if not moved:
        return []
    return [f"x b1 on the first and on the last half of the timed prompts differs by {statistics.median(moved):.2f} "
            f"(median over {len(moved)} cells; largest {moved[-1]:.2f}): the machine's drift while timing; "
            "differences in x b1 smaller than that are noise."]


def _nan(x) -> bool:
    return x is None or x == "" or (isinstance(x, float) and math.isnan(x))


def _state(r: dict) -> str:
    d = r["vs_strict_decision"]
    if d == NO_STRICT:
        return "no strict"
    hw = r["vs_strict"].half_width
    short = {WITHIN: "within", BEYOND: "beyond"}.get(d, "narrow" if is_decided(d) else "OPEN")
    return f"{short} ±{hw:.3f}"


def _sanity(rows: list[dict]) -> list[str]:
    out = ["Sanity check (strict is lossless: its utility minus AR's should contain 0):"]
    strict = [r for r in rows if r["method"] == STRICT]
    if not any(r["method"] == AR for r in rows):
        return out + ["  no AR cell in this group: no strict-vs-AR check, no comparisons with AR, no length "
                      "adjustment and no measured speed-ups"]
    if not strict:
        return out + ["  no strict cell in this group: no sanity check, and relaxed rules cannot be compared "
                      "with strict (no decisions, no best rule)"]
    ar_samples = {r["task"]: r["n_samples"] for r in rows if r["method"] == AR}
    for r in strict:
        ok = _nan(r["utility_diff_ci_low"]) or r["utility_diff_ci_low"] <= 0 <= r["utility_diff_ci_high"]
        paired = min(r["n_samples"], ar_samples.get(r["task"], r["n_samples"]))  # AR is not extended by looks
        out.append(f"  {r['task']} / {r['drafter']} N={r['draft_length']}: strict - AR "
                   f"{format_interval((r['utility_diff_vs_ar'], r['utility_diff_ci_low'], r['utility_diff_ci_high']), '{:+.3f}')} over "
                   f"{paired} paired samples{'' if ok else '  <-- excludes 0: check the engine or the run'}")
    return out


def _decisions(rows: list[dict], max_drop: float) -> list[str]:
    relaxed = [r for r in rows if r["method"] not in (AR, STRICT)]
    if not relaxed:
        return ["No relaxed cells."]
    missing = sorted({r["draft_length"] for r in relaxed if r["vs_strict_decision"] == NO_STRICT},
                     key=draft_length_order)
    decided = [r for r in relaxed if is_decided(r["vs_strict_decision"])]
    out = [f"Decisions vs strict (budget {max_drop:g}): {len(decided)} of {len(relaxed)} relaxed cells decided."]
    if missing:
        out.append(f"  no strict cell at N = {', '.join(map(str, missing))}: those relaxed cells cannot be decided")
    for r in relaxed:
        if r["vs_strict_decision"] not in (NO_STRICT,) and not is_decided(r["vs_strict_decision"]):
            out.append(f"  undecided: {r['task']} / {r['drafter']} {_label(r)} N={r['draft_length']}: half-width "
                       f"{r['vs_strict'].half_width:.3f} over {prompts_x_repeats(r['n_prompts'], r['n_samples'])} "
                       "samples; about "
                       f"{r['vs_strict_samples_needed']} paired samples of new prompts would bring it to {max_drop:g}")
    return out


def _best(rows: list[dict], max_drop: float) -> list[str]:
    out = [f"Best rule (highest length-adjusted speed-up among strict and the cells whose upper bound of the drop "
           f"vs strict is <= {max_drop:g}):"]
    if not any(r["method"] == STRICT for r in rows):
        return out + ["  no strict cell: cannot choose (every relaxed rule is judged against strict)"]
    found = best_rules(rows, max_drop)
    for b in found:
        where = f"{b['task']} / {b['drafter']}"
        if b["best"] is None:
            out.append(f"  {where}  {b['column']}: no eligible cell has this speed-up"
                       + ("" if any(r["method"] == AR for r in rows) else " (no AR cell: no length adjustment)"))
            continue
        r = b["best"]
        out.append(f"  {where}  {b['column']}: {_label(r)} N={r['draft_length']}  {b['speedup']:.2f}x  utility "
                   f"{r['utility']:.3f}" + ("" if r["method"] == STRICT else
                                           f" ({r['utility_diff_vs_strict']:+.3f} vs strict, lower bound "
                                           f"{r['utility_diff_vs_strict_ci_low']:+.3f})"))
    seen = set()
    for b in found:
        key = (b["settings_group"], b["verifier"], b["drafter"], b["task"])
        if key not in seen and b["undecidable"]:
            seen.add(key)
            out.append(f"  {b['task']} / {b['drafter']}: {len(b['undecidable'])} cells undecidable at this "
                       f"budget (their interval of the drop straddles it, narrow ones included) were left out: " + ", ".join(f"{_label(r)} N={r['draft_length']}"
                                                                  for r in b["undecidable"]))
    return out
