"""Reports from a result store: per-cell table rows, the terminal table, best rule per c_rel, CSV."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

from relaxspec.bench.grid import AR, method_label
from relaxspec.bench.speedup import C_REL_GRID, Interval, length_adjusted_speedup, lossless_within_ci, paired_diff_ci
from relaxspec.bench.store import Store

CSV_COLUMNS = [
    "verifier", "drafter", "task", "method", "params", "draft_length", "seed", "n_prompts", "n_samples",
    "utility", "utility_ci_low", "utility_ci_high",
    "utility_diff_vs_ar", "utility_diff_ci_low", "utility_diff_ci_high", "lossless_within_ci",
    "acceptance_rate", "acceptance_rate_per_position", "mean_acceptance_length", "mean_response_length",
    "c_rel_measured", "measured_speedup", "time_total_s",
    "modelled_speedup_measured_c_rel", *[f"modelled_speedup_c{c:g}" for c in C_REL_GRID],
    "length_adjusted_speedup_measured_c_rel", *[f"length_adjusted_speedup_c{c:g}" for c in C_REL_GRID],
    "temperature", "top_p", "top_k", "max_new_tokens", "truncated_fraction", "key",
]
# What an AR cell must share with a speculative cell to be its baseline.
_BASELINE_FIELDS = ("verifier", "verifier_version", "task", "seed", "limit", "repeats", "temperature", "top_k",
                    "top_p", "max_new_tokens", "code_version")


def _baseline_sig(config: dict) -> tuple:
    return tuple(json.dumps(config.get(f), sort_keys=True) for f in _BASELINE_FIELDS)


def build_rows(store: Store) -> list[dict]:
    """One dict per stored cell (CSV_COLUMNS keys), AR first within each baseline group."""
    cells = list(store.cells())
    baselines: dict[tuple, list] = {}
    for cell in cells:
        if cell.config["method"] == AR:
            baselines.setdefault(_baseline_sig(cell.config), []).append(cell)
    rows = []
    for cell in cells:
        cfg, m = cell.config, cell.metrics
        candidates = baselines.get(_baseline_sig(cfg), [])
        # prefer the AR cell from the same run (same machine load), else the newest
        same_run = [b for b in candidates if b.metrics.get("run_id") == m.get("run_id")]
        base = (same_run or candidates or [None])[-1]
        is_ar = cfg["method"] == AR
        row = {
            "verifier": cfg["verifier"], "drafter": cfg["drafter"] or "", "task": cfg["task"],
            "method": cfg["method"], "params": json.dumps(cfg["params"], sort_keys=True),
            "draft_length": cfg["draft_length"], "seed": cfg["seed"],
            "n_prompts": m["n_prompts"], "n_samples": m["n_samples"],
            "utility": m["utility"], "utility_ci_low": m["utility_ci_low"], "utility_ci_high": m["utility_ci_high"],
            "acceptance_rate": m.get("acceptance_rate", 0.0) if not is_ar else float("nan"),
            "acceptance_rate_per_position": json.dumps([round(x, 4) for x in m.get("acceptance_rate_per_position", [])]),
            "mean_acceptance_length": m["mean_acceptance_length"],
            "mean_response_length": m["mean_response_length"],
            "c_rel_measured": m.get("c_rel_measured") if m.get("c_rel_measured") is not None else float("nan"),
            "time_total_s": m["time_total_s"],
            "modelled_speedup_measured_c_rel": _num(m.get("modelled_speedup_measured_c_rel")),
            **{f"modelled_speedup_c{c:g}": m[f"modelled_speedup_c{c:g}"] for c in C_REL_GRID},
            "temperature": cfg["temperature"], "top_p": cfg["top_p"], "top_k": cfg["top_k"],
            "max_new_tokens": cfg["max_new_tokens"], "truncated_fraction": m.get("truncated_fraction", 0.0),
            "key": cell.key,
        }
        if base is not None:
            diff = Interval(0.0, 0.0, 0.0, m["n_samples"]) if base.key == cell.key else \
                paired_diff_ci(store.utilities(cell.key), store.utilities(base.key))
            l_ar = base.metrics["mean_response_length"]
            row.update(utility_diff_vs_ar=diff.mean, utility_diff_ci_low=diff.low, utility_diff_ci_high=diff.high,
                       lossless_within_ci=lossless_within_ci(diff) if not is_ar else True,
                       measured_speedup=base.metrics["time_total_s"] / m["time_total_s"] if m["time_total_s"] else
                       float("nan"))
            for suffix in ["measured_c_rel", *[f"c{c:g}" for c in C_REL_GRID]]:
                row[f"length_adjusted_speedup_{suffix}"] = length_adjusted_speedup(
                    row[f"modelled_speedup_{suffix}"], l_ar, m["mean_response_length"])
        else:
            nan = float("nan")
            row.update(utility_diff_vs_ar=nan, utility_diff_ci_low=nan, utility_diff_ci_high=nan,
                       lossless_within_ci="", measured_speedup=nan,
                       **{f"length_adjusted_speedup_{s}": nan for s in ["measured_c_rel", *[f"c{c:g}" for c in C_REL_GRID]]})
        rows.append(row)
    order = {AR: 0, "strict": 1}
    rows.sort(key=lambda r: (r["verifier"], r["task"], r["seed"], r["drafter"], r["draft_length"],
                             order.get(r["method"], 2), r["method"], _param_order(r["params"])))
    return rows


def _param_order(params_json: str) -> tuple:
    return tuple((k, float(v) if isinstance(v, (int, float)) else float("inf"))
                 for k, v in sorted(json.loads(params_json).items()))


def _num(x):
    return float("nan") if x is None else x


def write_csv(rows: list[dict], path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=CSV_COLUMNS, extrasaction="ignore")
        writer.writeheader()
        for row in rows:
            writer.writerow({k: _csv_value(row.get(k)) for k in CSV_COLUMNS})
    return path


def _csv_value(v):
    if isinstance(v, float):
        return "" if math.isnan(v) else f"{v:.6g}"
    return "" if v is None else v


def best_rules(rows: list[dict], max_drop: float = 0.05) -> list[dict]:
    """Per (verifier, drafter, task) and c_rel: the cell with the highest length-adjusted modelled speed-up
    whose utility drop vs AR (point estimate) is at most `max_drop`."""
    out = []
    groups = {}
    for r in rows:
        if r["method"] != AR:
            groups.setdefault((r["verifier"], r["drafter"], r["task"]), []).append(r)
    for (verifier, drafter, task), cells in groups.items():
        for label, col in [*[(f"{c:g}", f"length_adjusted_speedup_c{c:g}") for c in C_REL_GRID],
                           ("measured", "length_adjusted_speedup_measured_c_rel")]:
            ok = [r for r in cells if not math.isnan(r["utility_diff_vs_ar"]) and r["utility_diff_vs_ar"] >= -max_drop
                  and not math.isnan(r[col])]
            best = max(ok, key=lambda r: r[col], default=None)
            c_value = cells[0]["c_rel_measured"] if label == "measured" else float(label)
            out.append({"verifier": verifier, "drafter": drafter, "task": task, "c_rel": label, "c_rel_value": c_value,
                        "best": best, "speedup": best[col] if best else float("nan")})
    return out


def _label(r: dict) -> str:
    return method_label(r["method"], json.loads(r["params"]))


def _f(x, fmt="{:.2f}") -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return fmt.format(x)


def format_table(rows: list[dict], max_drop: float = 0.05) -> str:
    """The terminal report: one line per cell, then the best rule per c_rel."""
    if not rows:
        return "no finished cells"
    head = ["task", "drafter", "method", "N", "utility [95% CI]", "diff vs AR [95% CI]", "ok", "acc",
            "tau", "len", "S(c_meas)", "Slen .05", "Slen .2", "Slen .5", "wall x"]
    lines = []
    for r in rows:
        lossless = r["lossless_within_ci"]
        lines.append([
            r["task"], r["drafter"] or "-", _label(r), str(r["draft_length"]) if r["draft_length"] else "-",
            f"{r['utility']:.3f} [{_f(r['utility_ci_low'], '{:.3f}')}, {_f(r['utility_ci_high'], '{:.3f}')}]",
            "-" if r["method"] == AR else
            f"{_f(r['utility_diff_vs_ar'], '{:+.3f}')} [{_f(r['utility_diff_ci_low'], '{:+.3f}')}, "
            f"{_f(r['utility_diff_ci_high'], '{:+.3f}')}]",
            "" if r["method"] == AR else ("*" if lossless is True else ""),
            _f(r["acceptance_rate"]), _f(r["mean_acceptance_length"]), _f(r["mean_response_length"], "{:.0f}"),
            _f(r["modelled_speedup_measured_c_rel"]),
            *[_f(r[f"length_adjusted_speedup_c{c:g}"]) for c in C_REL_GRID],
            _f(r["measured_speedup"]),
        ])
    widths = [max(len(h), *(len(line[i]) for line in lines)) for i, h in enumerate(head)]
    fmt = lambda cols: "  ".join(c.ljust(w) if i < 3 else c.rjust(w) for i, (c, w) in enumerate(zip(cols, widths)))  # noqa: E731
    out = [fmt(head), fmt(["-" * w for w in widths])]
    out += [fmt(line) for line in lines]
    first = rows[0]
    out.append("")
    out.append(f"verifier {first['verifier']}; {first['n_samples']} samples per cell (prompts x repeats); "
               f"temperature {first['temperature']}, top_p {first['top_p']}")
    out.append("ok '*': lossless within the CI (paired 95% CI of utility minus AR contains 0 or lies above it). "
               "acc: acceptance rate; tau: mean acceptance length (tokens per verifier call, bonus included);")
    out.append("len: mean response tokens; S(c_meas): modelled speed-up tau/(1+N*c_rel) at the measured c_rel; "
               "Slen c: length-adjusted modelled speed-up S*L_AR/L at c_rel = c; wall x: measured AR time / time.")
    out.append("")
    out.append(f"Best rule per c_rel (highest length-adjusted speed-up with utility drop <= {max_drop:g} vs AR, "
               "point estimate):")
    for b in best_rules(rows, max_drop):
        c = f"{b['c_rel']}" if b["c_rel"] != "measured" else f"measured ({_f(b['c_rel_value'], '{:.3f}')})"
        if b["best"] is None:
            out.append(f"  {b['task']} / {b['drafter']}  c_rel {c}: none within the allowed drop")
        else:
            r = b["best"]
            out.append(f"  {b['task']} / {b['drafter']}  c_rel {c}: {_label(r)} N={r['draft_length']}  "
                       f"S_len {b['speedup']:.2f}x  utility {r['utility']:.3f} "
                       f"({r['utility_diff_vs_ar']:+.3f} vs AR)")
    return "\n".join(out)
